import pytest

# The contract's asserts live in a helper module, not a test module: have pytest
# rewrite them too, so failures show the compared values.
pytest.register_assert_rewrite(f"{__name__}.contract")
