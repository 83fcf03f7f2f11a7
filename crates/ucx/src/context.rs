//! The UCP context: the library's per-process state (transports, memory domains), shared by
//! all workers of the process.

use std::ffi::CString;
use std::ptr;
use std::sync::Arc;

use crate::sys::{self, Functions};
use crate::{Error, check};

/// How a [`Context`] is set up. Everything not named here comes from `UCX_*` environment
/// variables, read by UCX itself (`UCX_NET_DEVICES`, `UCX_RNDV_THRESH`, …).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContextConfig {
    /// UCX's transport list (`UCX_TLS`), e.g. `tcp` or `posix,sysv,cma,tcp`; `None` keeps the
    /// environment's choice (all transports unless `UCX_TLS` says otherwise).
    pub transports: Option<String>,
}

/// A UCP context with active messages, RMA and wake-ups. Cheap to clone; shared by threads.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

pub(crate) struct ContextInner {
    pub(crate) handle: sys::ucp_context_h,
    pub(crate) functions: &'static Functions,
}

// SAFETY: the context is created with `mt_workers_shared`, so UCX locks the state that workers
// on different threads share (memory registration); the handle itself is never changed.
unsafe impl Send for ContextInner {}
// SAFETY: as above.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: the handle came from ucp_init_version; every worker and memory region holds
        // an Arc of this context, so none is left.
        unsafe { (self.functions.ucp_cleanup)(self.handle) };
    }
}

/// The functions of the system's UCX, or [`Error::Unavailable`].
pub(crate) fn functions() -> Result<&'static Functions, Error> {
    sys::functions().map_err(Error::Unavailable)
}

/// True if `libucp.so.0` can be loaded on this machine.
pub fn is_available() -> bool {
    sys::functions().is_ok()
}

/// The version of the loaded UCX library (e.g. `1.13.1`).
pub fn version() -> Result<String, Error> {
    let functions = functions()?;
    // SAFETY: returns a static NUL-terminated string.
    let text = unsafe { std::ffi::CStr::from_ptr((functions.ucp_get_version_string)()) };
    Ok(text.to_string_lossy().into_owned())
}

/// True if the transport list `transports` (UCX_TLS syntax; `None`: all) may select a
/// shared-memory transport.
fn may_use_shared_memory(transports: Option<&str>) -> bool {
    let Some(list) = transports else { return true };
    if list.starts_with('^') {
        return true;
    }
    list.split(',').map(str::trim).any(|name| matches!(name, "all" | "sm" | "shm" | "mm" | "posix" | "sysv" | "xpmem"))
}

impl Context {
    /// Reads UCX's configuration, applies `config` and creates the context.
    pub fn new(config: &ContextConfig) -> Result<Context, Error> {
        let functions = functions()?;
        let mut ucx_config: *mut sys::ucp_config_t = ptr::null_mut();
        // SAFETY: null prefix and file mean the defaults ("UCX_" variables); UCX writes the
        // configuration pointer.
        check("ucp_config_read", unsafe { (functions.ucp_config_read)(ptr::null(), ptr::null(), &mut ucx_config) })?;
        let result = Self::init(functions, ucx_config, config);
        // SAFETY: the configuration came from ucp_config_read and is not used after this.
        unsafe { (functions.ucp_config_release)(ucx_config) };
        result
    }

    fn init(functions: &'static Functions, ucx_config: *mut sys::ucp_config_t, config: &ContextConfig) -> Result<Context, Error> {
        if let Some(transports) = &config.transports {
            let value =
                CString::new(transports.as_str()).map_err(|_| Error::Invalid(format!("transport list {transports:?} contains NUL")))?;
            // SAFETY: valid configuration and NUL-terminated strings.
            check("ucp_config_modify(TLS)", unsafe { (functions.ucp_config_modify)(ucx_config, c"TLS".as_ptr(), value.as_ptr()) })?;
        }
        // Shared-memory transports refuse endpoints with peer error handling unless told that
        // they may use it (UCX 1.13 and later); ringfs always needs failures detected.
        let transports = config.transports.clone().or_else(|| std::env::var("UCX_TLS").ok());
        if std::env::var_os("UCX_MM_ERROR_HANDLING").is_none() && may_use_shared_memory(transports.as_deref()) {
            // SAFETY: valid configuration and NUL-terminated strings.
            let status = unsafe { (functions.ucp_config_modify)(ucx_config, c"MM_ERROR_HANDLING".as_ptr(), c"y".as_ptr()) };
            if status != sys::UCS_OK {
                log::debug!("UCX does not know MM_ERROR_HANDLING ({}): shared memory may not be used", sys::status_text(status));
            }
        }
        // SAFETY: ucp_params_t is plain data; zero means "no optional field set".
        let mut params: sys::ucp_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = sys::UCP_PARAM_FIELD_FEATURES | sys::UCP_PARAM_FIELD_MT_WORKERS_SHARED | sys::UCP_PARAM_FIELD_NAME;
        params.features = sys::UCP_FEATURE_AM | sys::UCP_FEATURE_RMA | sys::UCP_FEATURE_WAKEUP;
        params.mt_workers_shared = 1;
        params.name = c"ringfs".as_ptr();
        let mut handle: sys::ucp_context_h = ptr::null_mut();
        // SAFETY: params and configuration are valid for the call; UCX writes the handle.
        check("ucp_init", unsafe {
            (functions.ucp_init_version)(sys::UCP_API_MAJOR, sys::UCP_API_MINOR, &params, ucx_config, &mut handle)
        })?;
        Ok(Context { inner: Arc::new(ContextInner { handle, functions }) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_is_possible_unless_the_list_leaves_it_out() {
        for (list, expected) in [
            (None, true),
            (Some("tcp"), false),
            (Some("posix,sysv,cma,tcp"), true),
            (Some("sm,tcp"), true),
            (Some("^tcp"), true),
            (Some("rc,ud"), false),
        ] {
            assert_eq!(may_use_shared_memory(list), expected, "{list:?}");
        }
    }
}
