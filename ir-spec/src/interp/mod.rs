//! The reference interpreter: the executable semantics of every op, in f64.
