//! Pod network namespaces (one implementation for all of Ambit: `ambit-netns`) and the start-up
//! check of what shared mode needs to use them.

use std::io;

pub use ambit_netns::{Netns, NetnsId};

/// Checks at startup that this process may switch namespaces (CAP_SYS_ADMIN) and mark
/// sockets (CAP_NET_ADMIN), as shared mode needs both.
pub fn check_capabilities(mark: Option<u32>) -> io::Result<()> {
    let own = Netns::own()?;
    own.run(|| ()).map_err(|e| {
        io::Error::other(format!("setns into our own netns failed ({e}); shared mode needs CAP_SYS_ADMIN"))
    })?;
    if let Some(mark) = mark {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        s.set_mark(mark).map_err(|e| {
            io::Error::other(format!("SO_MARK failed ({e}); shared mode needs CAP_NET_ADMIN"))
        })?;
    }
    Ok(())
}
