//! Deterministic initializers for params and states.
