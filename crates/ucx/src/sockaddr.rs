//! Conversions between `std::net::SocketAddr` and the C `sockaddr` UCX takes and returns.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use libc::{sockaddr_in, sockaddr_in6, sockaddr_storage, socklen_t};

/// `address` as a C socket address and its length.
pub(crate) fn to_c(address: &SocketAddr) -> (sockaddr_storage, socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all-zero is a valid (unspecified) value.
    let mut storage: sockaddr_storage = unsafe { std::mem::zeroed() };
    let length = match address {
        SocketAddr::V4(v4) => {
            let c = sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(v4.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large and aligned enough for any socket address.
            unsafe { std::ptr::write((&raw mut storage).cast::<sockaddr_in>(), c) };
            std::mem::size_of::<sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let c = sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: v6.ip().octets() },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: as above.
            unsafe { std::ptr::write((&raw mut storage).cast::<sockaddr_in6>(), c) };
            std::mem::size_of::<sockaddr_in6>()
        }
    };
    (storage, length as socklen_t)
}

/// The address in `storage`, if it is an IPv4 or IPv6 address.
pub(crate) fn from_c(storage: &sockaddr_storage) -> Option<SocketAddr> {
    match storage.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let c = unsafe { &*(storage as *const sockaddr_storage).cast::<sockaddr_in>() };
            let ip = Ipv4Addr::from(c.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(c.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let c = unsafe { &*(storage as *const sockaddr_storage).cast::<sockaddr_in6>() };
            let ip = Ipv6Addr::from(c.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(ip, u16::from_be(c.sin6_port), c.sin6_flowinfo, c.sin6_scope_id)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_through_c() {
        for text in ["127.0.0.1:7000", "10.1.2.3:1", "[::1]:9", "[fe80::1%2]:443"] {
            let address: SocketAddr = text.parse().unwrap();
            let (storage, length) = to_c(&address);
            assert!(length as usize <= std::mem::size_of::<sockaddr_storage>());
            assert_eq!(from_c(&storage), Some(address), "{text}");
        }
    }
}
