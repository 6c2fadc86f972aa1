//! Shared helpers for sinter integration tests.
