//! File reading and writing.
