//! Unit tests: golden and snapshot renderings, annotation parsing, parsers.
