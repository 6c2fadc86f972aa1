//! The `.sir` text format: lexer, parser (which also verifies), printer.
