// porcupine-check judges a client history of a key-value service with
// porcupine (github.com/anishathalye/porcupine): is each key, on its own,
// linearizable as a register with write, read and compare-and-set?
//
// The history is the JSON-lines format of docs/verify.md, one operation a
// line. `shardlease verify --history FILE` validates the file and runs this
// binary on it; it also runs alone:
//
//	porcupine-check [-time-limit-per-key 10s] [-max-ops 100000] [-html-dir DIR] [-json] FILE
//
// Exit status: 0 linearizable, 1 not linearizable, 3 unknown (a key's time
// limit ran out, or the history is longer than -max-ops), 2 the history or
// the command line could not be read. "Unknown" is never "yes": porcupine
// found no violation, but it did not finish looking.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

const (
	exitYes     = 0
	exitNo      = 1
	exitBad     = 2
	exitUnknown = 3
	// A line longer than this is refused: values are a workload's small
	// unique tokens, and a runaway line should not take the memory.
	maxLine = 1 << 20
)

// record is one line of the history, as docs/verify.md defines it. Fields
// this checker does not judge (generation, shard, final) are still declared
// so that an unknown field, most likely a typo, is refused.
type record struct {
	Client     json.RawMessage `json:"client"`
	Op         string          `json:"op"`
	Key        *string         `json:"key"`
	Value      *string         `json:"value"`
	Expected   *string         `json:"expected"`
	Swapped    *bool           `json:"swapped"`
	Invoked    *int64          `json:"invoked"`
	Completed  *int64          `json:"completed"`
	Outcome    string          `json:"outcome"`
	Generation *int64          `json:"generation"`
	Shard      json.RawMessage `json:"shard"`
	Final      bool            `json:"final"`
}

type opKind uint8

const (
	opRead opKind = iota
	opWrite
	opCas
)

type input struct {
	kind opKind
	// write: the value written; cas: the value swapped in.
	value string
	// cas only: the value compared against, absent when expectedSet is false.
	expected    string
	expectedSet bool
}

type output struct {
	// The operation's answer was lost: it may or may not have taken effect.
	unknown bool
	// read: what was read (present false: the key had no value).
	present bool
	value   string
	// cas: whether it swapped.
	swapped bool
}

// state is one key's register; comparable, so porcupine's default equality
// holds.
type state struct {
	present bool
	value   string
}

type meta struct {
	line       int
	generation *int64
}

var kvModel = porcupine.Model{
	Init: func() interface{} { return state{} },
	Step: func(st, in, out interface{}) (bool, interface{}) {
		s := st.(state)
		i := in.(input)
		o := out.(output)
		switch i.kind {
		case opRead:
			return o.unknown || (o.present == s.present && o.value == s.value), s
		case opWrite:
			return true, state{present: true, value: i.value}
		default:
			match := i.expectedSet == s.present && (!s.present || i.expected == s.value)
			next := s
			if match {
				next = state{present: true, value: i.value}
			}
			// An unknown compare-and-set is placed where the state decides
			// its result; where it took no effect, porcupine places it after
			// everything else (its return is at the end of the history).
			return o.unknown || o.swapped == match, next
		}
	},
	Hash: func(st interface{}) uint64 {
		s := st.(state)
		h := fnv.New64a()
		if s.present {
			h.Write([]byte{1})
			h.Write([]byte(s.value))
		}
		return h.Sum64()
	},
	DescribeOperation: func(in, out interface{}) string {
		i := in.(input)
		o := out.(output)
		var d string
		switch i.kind {
		case opRead:
			switch {
			case o.unknown:
				d = "read() -> ?"
			case o.present:
				d = fmt.Sprintf("read() -> %q", o.value)
			default:
				d = "read() -> absent"
			}
			return d
		case opWrite:
			d = fmt.Sprintf("write(%q)", i.value)
		default:
			exp := "absent"
			if i.expectedSet {
				exp = fmt.Sprintf("%q", i.expected)
			}
			d = fmt.Sprintf("cas(%s -> %q)", exp, i.value)
			if !o.unknown {
				if o.swapped {
					d += " -> swapped"
				} else {
					d += " -> not swapped"
				}
			}
		}
		if o.unknown {
			d += " (outcome unknown)"
		}
		return d
	},
	DescribeState: func(st interface{}) string {
		s := st.(state)
		if !s.present {
			return "absent"
		}
		return fmt.Sprintf("%q", s.value)
	},
	DescribeOperationMetadata: func(m interface{}) string {
		md := m.(meta)
		if md.generation == nil {
			return fmt.Sprintf("history line %d", md.line)
		}
		return fmt.Sprintf("history line %d, generation %d", md.line, *md.generation)
	},
}

type history struct {
	records int
	byKey   map[string][]porcupine.Operation
}

// parse reads the history; failed operations are left out (they took no
// effect), and unknown ones return at the end of the history: after every
// time the history mentions, so porcupine may place them anywhere after
// their invocation, including after everything else (no effect).
func parse(r io.Reader) (*history, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), maxLine)
	type pending struct {
		key string
		op  porcupine.Operation
		// unknown ops get their return once the end of the history is known.
		unknown bool
	}
	var ops []pending
	clients := map[string]int{}
	var end int64
	h := &history{byKey: map[string][]porcupine.Operation{}}
	line := 0
	for sc.Scan() {
		line++
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		h.records++
		var rec record
		dec := json.NewDecoder(bytes.NewReader(text))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&rec); err != nil {
			return nil, fmt.Errorf("line %d: %v", line, err)
		}
		if dec.More() {
			return nil, fmt.Errorf("line %d: more than one JSON value", line)
		}
		if len(rec.Client) == 0 || rec.Key == nil || rec.Invoked == nil {
			return nil, fmt.Errorf("line %d: client, key and invoked are required", line)
		}
		in := input{}
		switch rec.Op {
		case "read":
			in.kind = opRead
		case "write", "cas":
			in.kind = opWrite
			if rec.Op == "cas" {
				in.kind = opCas
				if rec.Expected != nil {
					in.expected, in.expectedSet = *rec.Expected, true
				}
			}
			if rec.Value == nil {
				return nil, fmt.Errorf("line %d: a %s needs the value it writes", line, rec.Op)
			}
			in.value = *rec.Value
		default:
			return nil, fmt.Errorf("line %d: op %q is not read, write or cas", line, rec.Op)
		}
		out := output{}
		switch rec.Outcome {
		case "ok":
			if rec.Completed == nil {
				return nil, fmt.Errorf("line %d: an ok operation needs its completion time", line)
			}
			if in.kind == opRead && rec.Value != nil {
				out.present, out.value = true, *rec.Value
			}
			if in.kind == opCas {
				if rec.Swapped == nil {
					return nil, fmt.Errorf("line %d: an ok cas needs swapped", line)
				}
				out.swapped = *rec.Swapped
			}
		case "failed":
			if rec.Completed == nil {
				return nil, fmt.Errorf("line %d: a failed operation needs its completion time", line)
			}
		case "unknown":
			out.unknown = true
		default:
			return nil, fmt.Errorf("line %d: outcome %q is not ok, failed or unknown", line, rec.Outcome)
		}
		if rec.Completed != nil && *rec.Completed < *rec.Invoked {
			return nil, fmt.Errorf("line %d: completed before it was invoked", line)
		}
		for _, t := range []*int64{rec.Invoked, rec.Completed} {
			if t != nil && *t > end {
				end = *t
			}
		}
		if rec.Outcome == "failed" {
			continue
		}
		id, ok := clients[string(rec.Client)]
		if !ok {
			id = len(clients)
			clients[string(rec.Client)] = id
		}
		op := porcupine.Operation{ClientId: id, Input: in, Call: *rec.Invoked, Output: out,
			Metadata: meta{line: line, generation: rec.Generation}}
		if !out.unknown {
			op.Return = *rec.Completed
		}
		ops = append(ops, pending{key: *rec.Key, op: op, unknown: out.unknown})
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("line %d: longer than %d bytes", line+1, maxLine)
		}
		return nil, err
	}
	for _, p := range ops {
		if p.unknown {
			p.op.Return = end + 1
		}
		h.byKey[p.key] = append(h.byKey[p.key], p.op)
	}
	return h, nil
}

type keyResult struct {
	Key           string  `json:"key"`
	Result        string  `json:"result"` // ok, illegal, unknown
	Ops           int     `json:"ops"`
	Seconds       float64 `json:"seconds"`
	Visualization string  `json:"visualization,omitempty"`
	Error         string  `json:"error,omitempty"`
}

type summary struct {
	Linearizable string      `json:"linearizable"` // yes, no, unknown
	Ops          int         `json:"ops"`
	Reason       string      `json:"reason,omitempty"`
	Keys         []keyResult `json:"keys"`
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// htmlName is a file name for a key that any key maps to safely and two
// keys never share (the hash tells apart keys that clean up alike).
func htmlName(key string) string {
	clean := unsafeName.ReplaceAllString(key, "_")
	if len(clean) > 40 {
		clean = clean[:40]
	}
	h := fnv.New32a()
	h.Write([]byte(key))
	return fmt.Sprintf("porcupine-%s-%08x.html", clean, h.Sum32())
}

func checkKey(key string, ops []porcupine.Operation, limit time.Duration, htmlDir string) keyResult {
	t0 := time.Now()
	kr := keyResult{Key: key, Ops: len(ops)}
	// The plain check first: the verbose one keeps every partial
	// linearization, which only a failing key's visualization needs.
	switch porcupine.CheckOperationsTimeout(kvModel, ops, limit) {
	case porcupine.Ok:
		kr.Result = "ok"
	case porcupine.Unknown:
		kr.Result = "unknown"
	default:
		kr.Result = "illegal"
		_, info := porcupine.CheckOperationsVerbose(kvModel, ops, limit)
		path := filepath.Join(htmlDir, htmlName(key))
		err := os.MkdirAll(htmlDir, 0o755)
		if err == nil {
			err = porcupine.VisualizePath(kvModel, info, path)
		}
		if err != nil {
			kr.Error = fmt.Sprintf("could not write the visualization: %v", err)
		} else if abs, err := filepath.Abs(path); err == nil {
			kr.Visualization = abs
		} else {
			kr.Visualization = path
		}
	}
	kr.Seconds = time.Since(t0).Seconds()
	return kr
}

func judge(h *history, limit time.Duration, maxOps int, htmlDir string) summary {
	s := summary{Ops: h.records, Keys: []keyResult{}}
	if h.records > maxOps {
		s.Linearizable = "unknown"
		s.Reason = fmt.Sprintf("the history has %d operations, over the cap of %d: not checked",
			h.records, maxOps)
		return s
	}
	keys := make([]string, 0, len(h.byKey))
	for k := range h.byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	results := make([]keyResult, len(keys))
	// Each key has its own time limit, so keys are checked one per call;
	// as many at once as there are processors to run them.
	work := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < runtime.GOMAXPROCS(0); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				results[i] = checkKey(keys[i], h.byKey[keys[i]], limit, htmlDir)
			}
		}()
	}
	for i := range keys {
		work <- i
	}
	close(work)
	wg.Wait()
	s.Keys = results
	s.Linearizable = "yes"
	for _, r := range results {
		switch r.Result {
		case "illegal":
			s.Linearizable = "no"
		case "unknown":
			if s.Linearizable == "yes" {
				s.Linearizable = "unknown"
				s.Reason = "a key's time limit ran out before porcupine finished"
			}
		}
	}
	if s.Linearizable == "no" {
		s.Reason = ""
	}
	return s
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("porcupine-check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	limit := fs.Duration("time-limit-per-key", 10*time.Second,
		"how long porcupine may search one key; past it the key's verdict is unknown")
	maxOps := fs.Int("max-ops", 100000,
		"a history with more operations than this is not checked (verdict unknown)")
	htmlDir := fs.String("html-dir", ".", "where the visualization of a failing key is written")
	asJSON := fs.Bool("json", false, "print the verdict as one JSON object")
	if err := fs.Parse(args); err != nil {
		return exitBad
	}
	if fs.NArg() != 1 || *limit <= 0 || *maxOps < 1 {
		fmt.Fprintln(stderr, "usage: porcupine-check [flags] HISTORY (a positive time limit and cap)")
		return exitBad
	}
	f, err := os.Open(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "porcupine-check: %v\n", err)
		return exitBad
	}
	h, err := parse(f)
	f.Close()
	if err != nil {
		fmt.Fprintf(stderr, "porcupine-check: %s: %v\n", fs.Arg(0), err)
		return exitBad
	}
	s := judge(h, *limit, *maxOps, *htmlDir)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		if err := enc.Encode(s); err != nil {
			return exitBad
		}
	} else {
		for _, r := range s.Keys {
			line := fmt.Sprintf("key %q: %s (%d ops, %.2f s)", r.Key, r.Result, r.Ops, r.Seconds)
			if r.Visualization != "" {
				line += "; porcupine's visualization: " + r.Visualization
			}
			if r.Error != "" {
				line += "; " + r.Error
			}
			fmt.Fprintln(stdout, line)
		}
		if s.Reason != "" {
			fmt.Fprintln(stdout, s.Reason)
		}
		fmt.Fprintf(stdout, "linearizable: %s\n", s.Linearizable)
	}
	switch s.Linearizable {
	case "yes":
		return exitYes
	case "no":
		return exitNo
	default:
		return exitUnknown
	}
}
