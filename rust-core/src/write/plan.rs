//! See the module docs of `write`.
