//! Front-end expansion of composite ops (`attention`) into primitives.
