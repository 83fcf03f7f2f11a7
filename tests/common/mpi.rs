//! The MPI the tests compile and run MPI programs with: MPICH where it is installed, named
//! explicitly (`mpicc.mpich`, `mpiexec.mpich`: Debian points the plain names at whichever MPI
//! was installed last), otherwise whatever `mpicc` and `mpiexec` are — Open MPI then gets the
//! settings it needs to run as root and on more ranks than cores.

use std::path::Path;
use std::process::{Command, Output};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    Mpich,
    OpenMpi,
}

#[derive(Clone, Debug)]
pub struct Mpi {
    pub compiler: String,
    pub launcher: String,
    pub flavour: Flavour,
}

fn runs(program: &str, argument: &str) -> Option<String> {
    let output = Command::new(program).arg(argument).output().ok()?;
    Some(format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr)))
}

impl Mpi {
    /// The installed MPI (MPICH preferred), or `None`.
    pub fn find() -> Option<Mpi> {
        if runs("mpicc.mpich", "-show").is_some() && runs("mpiexec.mpich", "--version").is_some() {
            return Some(Mpi { compiler: "mpicc.mpich".into(), launcher: "mpiexec.mpich".into(), flavour: Flavour::Mpich });
        }
        runs("mpicc", "-show")?;
        let version = runs("mpiexec", "--version")?;
        let flavour = if version.contains("Open MPI") || version.contains("OpenRTE") { Flavour::OpenMpi } else { Flavour::Mpich };
        Some(Mpi { compiler: "mpicc".into(), launcher: "mpiexec".into(), flavour })
    }

    /// Compiles `source` into `program`.
    pub fn compile(&self, source: &Path, program: &Path) -> Output {
        Command::new(&self.compiler).args(["-O1", "-Wall", "-Werror"]).arg(source).arg("-o").arg(program).output().unwrap()
    }

    /// `mpiexec -n RANKS` (for Open MPI: allowed as root, and oversubscribing the cores).
    pub fn mpiexec(&self, ranks: usize) -> Command {
        let mut command = Command::new(&self.launcher);
        if self.flavour == Flavour::OpenMpi {
            command.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1").arg("--oversubscribe");
        }
        command.args(["-n", &ranks.to_string()]);
        command
    }

    /// The `srun --mpi` plugin that starts this MPI's ranks under Slurm.
    pub fn srun_plugin(&self) -> &'static str {
        match self.flavour {
            Flavour::Mpich => "pmi2",
            Flavour::OpenMpi => "pmix",
        }
    }
}
