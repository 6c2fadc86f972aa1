//! sinter runtime.
