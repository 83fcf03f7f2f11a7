//! The hand-written declarations of `src/sys.rs` against the installed UCX headers: a C
//! program compiled here prints the size of every struct and the offset of every field the
//! crate declares, and each must equal what Rust laid out.

mod common;

use std::mem::{offset_of, size_of};
use std::path::Path;
use std::process::Command;

use ringfs_ucx::sys;

/// (C type, Rust size, [(field, Rust offset)]).
type Layout = (&'static str, usize, Vec<(&'static str, usize)>);

macro_rules! layouts {
    ($($rust:ident => $c:literal { $($field:ident),* $(,)? })*) => {
        vec![$(($c, size_of::<sys::$rust>(), vec![$((stringify!($field), offset_of!(sys::$rust, $field))),*])),*]
    };
}

fn declared_layouts() -> Vec<Layout> {
    layouts! {
        ucp_params_t => "ucp_params_t" { field_mask, features, request_size, request_init, request_cleanup, tag_sender_mask, mt_workers_shared, estimated_num_eps, estimated_num_ppn, name }
        ucs_cpu_set_t => "ucs_cpu_set_t" { ucs_bits }
        ucp_worker_params_t => "ucp_worker_params_t" { field_mask, thread_mode, cpu_mask, events, user_data, event_fd, flags, name, am_alignment, client_id }
        ucs_sock_addr_t => "ucs_sock_addr_t" { addr, addrlen }
        ucp_err_handler_t => "ucp_err_handler_t" { cb, arg }
        ucp_ep_params_t => "ucp_ep_params_t" { field_mask, address, err_mode, err_handler, user_data, flags, sockaddr, conn_request, name, local_sockaddr }
        ucp_listener_accept_handler_t => "ucp_listener_accept_handler_t" { cb, arg }
        ucp_listener_conn_handler_t => "ucp_listener_conn_handler_t" { cb, arg }
        ucp_listener_params_t => "ucp_listener_params_t" { field_mask, sockaddr, accept_handler, conn_handler }
        ucp_listener_attr_t => "ucp_listener_attr_t" { field_mask, sockaddr }
        ucp_conn_request_attr_t => "ucp_conn_request_attr_t" { field_mask, client_address, client_id }
        ucp_mem_map_params_t => "ucp_mem_map_params_t" { field_mask, address, length, flags, prot, memory_type }
        ucp_request_param_t => "ucp_request_param_t" { op_attr_mask, flags, request, cb, datatype, user_data, reply_buffer, memory_type, recv_info, memh }
        ucp_dt_iov_t => "ucp_dt_iov_t" { buffer, length }
        ucp_am_recv_param_t => "ucp_am_recv_param_t" { recv_attr, reply_ep }
        ucp_am_handler_param_t => "ucp_am_handler_param_t" { field_mask, id, flags, cb, arg }
    }
}

/// The C program printing `NAME SIZE` and `NAME.FIELD OFFSET` lines.
fn c_program(layouts: &[Layout]) -> String {
    let mut program =
        String::from("#include <stddef.h>\n#include <stdio.h>\n#include <ucp/api/ucp.h>\n#include <ucm/api/ucm.h>\nint main(void) {\n");
    for (name, _, fields) in layouts {
        program += &format!("  printf(\"{name} %zu\\n\", sizeof({name}));\n");
        for (field, _) in fields {
            program += &format!("  printf(\"{name}.{field} %zu\\n\", offsetof({name}, {field}));\n");
        }
    }
    program += "  printf(\"ucm_event_t.vm_unmapped.address %zu\\n\", offsetof(ucm_event_t, vm_unmapped.address));\n";
    program += "  printf(\"ucm_event_t.vm_unmapped.size %zu\\n\", offsetof(ucm_event_t, vm_unmapped.size));\n";
    program += "  return 0;\n}\n";
    program
}

fn expected_lines(layouts: &[Layout]) -> Vec<String> {
    let mut lines = Vec::new();
    for (name, size, fields) in layouts {
        lines.push(format!("{name} {size}"));
        lines.extend(fields.iter().map(|(field, offset)| format!("{name}.{field} {offset}")));
    }
    lines.push(format!("ucm_event_t.vm_unmapped.address {}", offset_of!(sys::ucm_vm_unmapped_t, address)));
    lines.push(format!("ucm_event_t.vm_unmapped.size {}", offset_of!(sys::ucm_vm_unmapped_t, size)));
    lines
}

#[test]
fn declared_structs_match_the_installed_ucx_headers() {
    if !Path::new("/usr/include/ucp/api/ucp.h").exists() {
        assert!(std::env::var("RINGFS_REQUIRE_UCX").as_deref() != Ok("1"), "UCX headers are missing but RINGFS_REQUIRE_UCX=1");
        eprintln!("SKIPPED: the UCX headers (libucx-dev) are not installed");
        return;
    }
    let layouts = declared_layouts();
    let directory = std::env::temp_dir().join(format!("ringfs-ucx-layout-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let source = directory.join("layout.c");
    let binary = directory.join("layout");
    std::fs::write(&source, c_program(&layouts)).unwrap();
    let compiled = Command::new("cc").arg(&source).arg("-o").arg(&binary).output().expect("run the C compiler");
    assert!(compiled.status.success(), "{}", String::from_utf8_lossy(&compiled.stderr));
    let output = Command::new(&binary).output().unwrap();
    std::fs::remove_dir_all(&directory).unwrap();
    let printed: Vec<String> = String::from_utf8(output.stdout).unwrap().lines().map(str::to_string).collect();
    let expected = expected_lines(&layouts);
    let differences: Vec<String> =
        expected.iter().zip(&printed).filter(|(rust, c)| rust != c).map(|(rust, c)| format!("Rust {rust} vs C {c}")).collect();
    assert_eq!(printed.len(), expected.len());
    assert!(differences.is_empty(), "layouts differ from the headers:\n{}", differences.join("\n"));
}
