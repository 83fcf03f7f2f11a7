//! What other clients changed lately (`Changes`), for a FUSE mount that lets the kernel keep
//! names and attributes long and tells it to drop what changed elsewhere: every server keeps
//! a log of the files and names changed there (`crates/server/src/changes.rs`), and a watcher
//! keeps its place in each.

use std::collections::HashMap;

use ringfs_proto::{ChangesSince, Errno, FileId, Request, Response};

use crate::{Client, Result};

/// Where a watcher stands in each server's change log, by server name.
#[derive(Debug, Default)]
pub struct ChangeWatch {
    positions: HashMap<String, (u64, u64)>,
}

/// What other clients changed since the last look.
#[derive(Debug, Default)]
pub struct Changes {
    /// Files whose attributes or bytes changed.
    pub files: Vec<FileId>,
    /// Names created, removed or replaced.
    pub names: Vec<String>,
    /// False when a server could not tell (first look, a restart, or more changes since the
    /// last look than it keeps): anything may have changed.
    pub complete: bool,
}

impl Client {
    /// Asks every live server what clients other than this one changed since `watch`'s last
    /// look, and moves `watch` on. Fails (moving nothing) if a server does not answer.
    pub fn changes(&self, watch: &mut ChangeWatch) -> Result<Changes> {
        let cluster = &self.inner.cluster;
        let members: Vec<_> = cluster.member_list().members.into_iter().filter(|member| member.alive).collect();
        let connections = members.iter().map(|member| cluster.connection(member)).collect::<Result<Vec<_>>>()?;
        let calls: Vec<_> = members
            .iter()
            .zip(&connections)
            .map(|(member, connection)| {
                let (epoch, after) = watch.positions.get(&member.name).copied().unwrap_or((0, 0));
                connection.start(&Request::Changes(ChangesSince { epoch, after, client: self.inner.client_id }), &[], None)
            })
            .collect();
        let mut lists = Vec::with_capacity(calls.len());
        for (connection, call) in connections.iter().zip(calls) {
            match cluster.finish(connection, call)?.response {
                Response::ChangeList(list) => lists.push(list),
                _ => return Err(Errno::EPROTO),
            }
        }
        let mut changes = Changes { complete: true, ..Changes::default() };
        for (member, list) in members.iter().zip(lists) {
            watch.positions.insert(member.name.clone(), (list.epoch, list.last));
            changes.complete &= list.complete;
            changes.files.extend(list.files);
            changes.names.extend(list.names);
        }
        Ok(changes)
    }
}
