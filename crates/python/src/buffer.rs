//! Borrowing the memory of any Python object with the buffer protocol (bytes, bytearray,
//! memoryview, NumPy arrays, mmap), so reads land in it and writes leave from it without a copy.

use pyo3::ffi;
use pyo3::prelude::*;

/// A contiguous byte view of a Python object, held (the object cannot resize or free it) until
/// dropped. Any item type is accepted: the bytes are what count.
pub struct ContiguousBuffer {
    // Boxed: Python may keep pointers into the struct between GetBuffer and Release.
    view: Box<ffi::Py_buffer>,
}

/// The raw memory of a [`ContiguousBuffer`], to hand to a thread that runs without the GIL.
#[derive(Clone, Copy)]
pub struct RawBytes {
    address: usize,
    len: usize,
}

impl ContiguousBuffer {
    /// Borrows `object`'s memory; `writable` asks for memory Python allows us to write.
    pub fn get(object: &Bound<'_, PyAny>, writable: bool) -> PyResult<ContiguousBuffer> {
        // SAFETY: an all-zero Py_buffer is a valid "empty" value; GetBuffer fills it or fails.
        let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
        let flags = if writable { ffi::PyBUF_WRITABLE } else { ffi::PyBUF_SIMPLE };
        // SAFETY: the GIL is held (we have a Bound), and view points to a writable Py_buffer.
        if unsafe { ffi::PyObject_GetBuffer(object.as_ptr(), &mut *view, flags) } == -1 {
            let error = PyErr::fetch(object.py());
            // As the built-in files do: a read-only object is the wrong type for a read.
            if writable && error.is_instance_of::<pyo3::exceptions::PyBufferError>(object.py()) {
                let type_name = object.get_type().name().map(|name| name.to_string()).unwrap_or_default();
                return Err(pyo3::exceptions::PyTypeError::new_err(format!("a writable bytes-like object is required, not '{type_name}'")));
            }
            return Err(error);
        }
        Ok(ContiguousBuffer { view })
    }

    /// The memory, valid while `self` lives.
    pub fn raw(&self) -> RawBytes {
        RawBytes { address: self.view.buf as usize, len: self.view.len.max(0) as usize }
    }
}

impl Drop for ContiguousBuffer {
    fn drop(&mut self) {
        // SAFETY: the view was filled by a successful PyObject_GetBuffer and is released once.
        Python::with_gil(|_| unsafe { ffi::PyBuffer_Release(&mut *self.view) });
    }
}

impl RawBytes {
    /// # Safety
    /// The [`ContiguousBuffer`] this came from must outlive the slice.
    pub unsafe fn as_slice<'a>(self) -> &'a [u8] {
        if self.len == 0 { &[] } else { unsafe { std::slice::from_raw_parts(self.address as *const u8, self.len) } }
    }

    /// # Safety
    /// The [`ContiguousBuffer`] this came from must be writable and outlive the slice; no one
    /// else may use that memory meanwhile (as with `os.readv`, Python code that does races).
    pub unsafe fn as_mut_slice<'a>(self) -> &'a mut [u8] {
        if self.len == 0 { &mut [] } else { unsafe { std::slice::from_raw_parts_mut(self.address as *mut u8, self.len) } }
    }
}
