//! Header parsing.
