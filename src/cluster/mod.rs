//! Valkey Cluster placement: which hash slot an item belongs to, and the short hash tags that
//! put a key in a chosen slot. Pure; the server glue that reads slot ownership comes later.

pub mod slot;
