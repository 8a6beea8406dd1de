//! `linux/netlink.h`, defined once for every family.

pub const NLMSG_HDRLEN: usize = 16;
pub const NLMSG_NOOP: u16 = 0x1;
pub const NLMSG_ERROR: u16 = 0x2;
pub const NLMSG_DONE: u16 = 0x3;
pub const NLMSG_OVERRUN: u16 = 0x4;
pub const NLM_F_REQUEST: u16 = 0x01;
/// Set by the kernel on dump rows; only tests build such messages.
#[cfg(test)]
pub const NLM_F_MULTI: u16 = 0x02;
pub const NLM_F_ACK: u16 = 0x04;
pub const NLM_F_DUMP_INTR: u16 = 0x10;
pub const NLM_F_DUMP: u16 = 0x100 | 0x200;
pub const NLM_F_REPLACE: u16 = 0x100;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLM_F_APPEND: u16 = 0x800;
/// Set on an `NLMSG_ERROR` whose echoed request was cut to its header.
pub const NLM_F_CAPPED: u16 = 0x100;
/// Set on an `NLMSG_ERROR` that carries extended-ack TLVs.
pub const NLM_F_ACK_TLVS: u16 = 0x200;
pub const NLMSGERR_ATTR_MSG: u16 = 1;
pub const NLA_F_NESTED: u16 = 0x8000;
pub const NLA_TYPE_MASK: u16 = 0x3fff;
