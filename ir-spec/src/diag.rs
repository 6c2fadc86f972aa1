//! Diagnostics with source spans, rendered with codespan-reporting.
