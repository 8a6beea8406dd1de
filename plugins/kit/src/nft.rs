//! nf_tables over netlink (in progress)
