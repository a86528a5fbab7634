//! Empty: the tests live in `tests/`.
