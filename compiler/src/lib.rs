//! sinter compiler.
