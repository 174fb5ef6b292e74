//! Tollgate controller library.
