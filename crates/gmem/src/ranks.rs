//! Who this process is in its job: its rank, the number of ranks and the job's id, from
//! `ringfs run --ranks` or from the launcher that started it (mpirun, srun, PMI), with no
//! MPI library linked.

use ringfs_config::env;
use ringfs_proto::Errno;

/// A rank's place in its job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankIdentity {
    pub rank: u32,
    pub ranks: u32,
    /// Ranks of one job share it; collective steps of different jobs never mix. Defaults
    /// to a hash of the job's secret (`RINGFS_GMEM_JOB` sets it, to run two programs at
    /// once on one cluster).
    pub job: u64,
}

/// Environment variables naming a rank and the number of ranks, in the order looked at.
const LAUNCHERS: [(&str, &str); 5] = [
    (env::GMEM_RANK, env::GMEM_RANKS),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMIX_RANK", "PMIX_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
];

/// The identity the environment gives (`lookup` reads a variable): a single rank when no
/// launcher set one. EINVAL for a rank outside the job.
pub fn identity_from(lookup: impl Fn(&str) -> Option<String>) -> Result<RankIdentity, Errno> {
    let number = |name: &str| lookup(name).and_then(|value| value.trim().parse::<u32>().ok());
    let (rank, ranks) = LAUNCHERS.iter().find_map(|(rank, size)| Some((number(rank)?, number(size)?))).unwrap_or((0, 1));
    if ranks == 0 || rank >= ranks {
        return Err(Errno::EINVAL);
    }
    let job = match lookup(env::GMEM_JOB) {
        Some(job) => u64::from_str_radix(job.trim().trim_start_matches("0x"), 16).map_err(|_| Errno::EINVAL)?,
        None => xxhash_rust::xxh3::xxh3_64(lookup(env::SECRET).unwrap_or_default().as_bytes()),
    };
    Ok(RankIdentity { rank, ranks, job })
}

/// [`identity_from`] the process's environment.
pub fn identity_from_env() -> Result<RankIdentity, Errno> {
    identity_from(|name| std::env::var(name).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn environment(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect();
        move |name| pairs.iter().find(|(key, _)| key == name).map(|(_, value)| value.clone())
    }

    #[test]
    fn ranks_come_from_ringfs_or_the_launcher() {
        let own = identity_from(environment(&[(env::GMEM_RANK, "2"), (env::GMEM_RANKS, "4"), (env::GMEM_JOB, "ff")])).unwrap();
        assert_eq!(own, RankIdentity { rank: 2, ranks: 4, job: 255 });
        let mpi = identity_from(environment(&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "3"), (env::SECRET, "s")])).unwrap();
        assert_eq!((mpi.rank, mpi.ranks), (1, 3));
        assert_eq!(mpi.job, identity_from(environment(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "3"), (env::SECRET, "s")])).unwrap().job);
        assert_eq!(identity_from(environment(&[])).unwrap().ranks, 1);
        assert_eq!(identity_from(environment(&[("PMI_RANK", "3"), ("PMI_SIZE", "3")])), Err(Errno::EINVAL));
    }
}
