//! Graphs: kernel and empty nodes, instantiation, launch.
//!
//! A graph is a list of nodes; instantiating it snapshots its kernels; launching the
//! executable graph queues all of them back to back on the stream (the sum of their
//! durations), or, on a capturing stream, adds them to the capture graph.

use std::ffi::{c_char, c_uint, c_ulonglong};

use cudarc::driver::sys::{
    CUDA_KERNEL_NODE_PARAMS_v1, CUDA_KERNEL_NODE_PARAMS_v2, CUfunction, CUgraph, CUgraphExec,
    CUgraphInstantiateResult, CUgraphNode, CUresult, CUstream, CUDA_GRAPH_INSTANTIATE_PARAMS,
};

use super::launch::{out_handle, Kernel};
use super::process::{self, Process};
use super::{entry, CuResult};
use crate::ffi;

/// One node: a kernel, or an empty node.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Node {
    pub handle: u64,
    pub kernel: Option<Kernel>,
}

#[derive(Debug, Clone)]
pub(crate) struct Graph {
    pub ctx: u64,
    pub nodes: Vec<Node>,
}

impl Graph {
    pub fn new(ctx: u64) -> Graph {
        Graph {
            ctx,
            nodes: Vec::new(),
        }
    }

    pub fn add_node(&mut self, handle: u64, kernel: Option<Kernel>) {
        self.nodes.push(Node { handle, kernel });
    }

    fn kernels(&self) -> Vec<Kernel> {
        self.nodes.iter().filter_map(|n| n.kernel).collect()
    }
}

/// An executable graph: the kernels of its graph when instantiated.
#[derive(Debug, Clone)]
pub(crate) struct Exec {
    pub ctx: u64,
    pub kernels: Vec<Kernel>,
}

impl Process {
    /// Add a node to `graph` after `deps` (which must be nodes of it); returns its handle.
    fn add_node(
        &mut self,
        graph: CUgraph,
        deps: *const CUgraphNode,
        count: usize,
        kernel: Option<Kernel>,
    ) -> CuResult<u64> {
        if count > 0 && deps.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let deps: &[CUgraphNode] = if count == 0 {
            &[]
        } else {
            // SAFETY: non-NULL and holding `count` node handles (driver API contract).
            unsafe { std::slice::from_raw_parts(deps, count) }
        };
        let handle = self.new_handle();
        let g = self
            .graphs
            .get_mut(&(graph as u64))
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let known = |d: &CUgraphNode| g.nodes.iter().any(|n| n.handle == *d as u64);
        if !deps.iter().all(known) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        g.add_node(handle, kernel);
        Ok(handle)
    }

    fn instantiate(&mut self, graph: CUgraph) -> CuResult<u64> {
        let g = self
            .graphs
            .get(&(graph as u64))
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let exec = Exec {
            ctx: g.ctx,
            kernels: g.kernels(),
        };
        let handle = self.new_handle();
        self.graph_execs.insert(handle, exec);
        Ok(handle)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphCreate(graph: *mut CUgraph, flags: c_uint) -> CUresult {
    entry(|| {
        if graph.is_null() || flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let handle = process::with(|p| {
            let (ctx, _) = p.current_ctx()?;
            let handle = p.new_handle();
            p.graphs.insert(handle, Graph::new(ctx));
            Ok(handle)
        })?;
        out_handle(graph, handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(graph: CUgraph) -> CUresult {
    entry(|| {
        process::with(|p| {
            p.graphs
                .remove(&(graph as u64))
                .map(|_| ())
                .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
        })
    })
}

fn add_kernel_node(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: Option<(CUfunction, [c_uint; 3], [c_uint; 3])>,
) -> CuResult {
    let (f, grid, block) = params.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if node.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let handle = process::with(|p| {
        let kernel = p.kernel(f, grid, block)?;
        p.add_node(graph, deps, count, Some(kernel))
    })?;
    out_handle(node, handle)
}

/// CUDA 10.0's node parameters (no kernel/context fields).
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddKernelNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *const CUDA_KERNEL_NODE_PARAMS_v1,
) -> CUresult {
    entry(|| {
        // SAFETY: `params` is NULL or points to the struct (driver API contract); its fields
        // are integers and pointers.
        let p = unsafe { ffi::read(params) }.ok().map(|p| {
            (
                p.func,
                [p.gridDimX, p.gridDimY, p.gridDimZ],
                [p.blockDimX, p.blockDimY, p.blockDimZ],
            )
        });
        add_kernel_node(node, graph, deps, count, p)
    })
}

/// CUDA 12's node parameters; `kern`/`ctx` are ignored (the function's context is used).
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddKernelNode_v2(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *const CUDA_KERNEL_NODE_PARAMS_v2,
) -> CUresult {
    entry(|| {
        // SAFETY: as in cuGraphAddKernelNode.
        let p = unsafe { ffi::read(params) }.ok().map(|p| {
            (
                p.func,
                [p.gridDimX, p.gridDimY, p.gridDimZ],
                [p.blockDimX, p.blockDimY, p.blockDimZ],
            )
        });
        add_kernel_node(node, graph, deps, count, p)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddEmptyNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
) -> CUresult {
    entry(|| {
        if node.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let handle = process::with(|p| p.add_node(graph, deps, count, None))?;
        out_handle(node, handle)
    })
}

/// `nodes` NULL: the count. Otherwise up to `*count` nodes; unused entries are set to NULL
/// and `*count` receives the number written.
#[no_mangle]
pub unsafe extern "C" fn cuGraphGetNodes(
    graph: CUgraph,
    nodes: *mut CUgraphNode,
    count: *mut usize,
) -> CUresult {
    entry(|| {
        // SAFETY: `count` is NULL or readable (driver API contract).
        let capacity = unsafe { ffi::read(count) }?;
        let handles: Vec<u64> = process::with(|p| {
            let g = p
                .graphs
                .get(&(graph as u64))
                .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
            Ok(g.nodes.iter().map(|n| n.handle).collect())
        })?;
        if nodes.is_null() {
            // SAFETY: `count` is writable (checked readable above; driver API contract).
            return Ok(unsafe { ffi::write(count, handles.len()) }?);
        }
        let written = handles.len().min(capacity);
        for i in 0..capacity {
            let value = handles.get(i).map_or(0, |&h| h) as usize as CUgraphNode;
            // SAFETY: `nodes` holds `capacity` writable handles (driver API contract).
            unsafe { nodes.add(i).write_unaligned(value) };
        }
        // SAFETY: as above.
        Ok(unsafe { ffi::write(count, written) }?)
    })
}

fn instantiate(exec: *mut CUgraphExec, graph: CUgraph) -> CuResult {
    if exec.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let handle = process::with(|p| p.instantiate(graph))?;
    out_handle(exec, handle)
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    _flags: c_ulonglong,
) -> CUresult {
    entry(|| instantiate(exec, graph))
}

/// CUDA 10.0 / 11.0's signature; no error node or log is ever produced.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    _error_node: *mut CUgraphNode,
    _log: *mut c_char,
    _log_size: usize,
) -> CUresult {
    entry(|| instantiate(exec, graph))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    _error_node: *mut CUgraphNode,
    _log: *mut c_char,
    _log_size: usize,
) -> CUresult {
    entry(|| instantiate(exec, graph))
}

fn instantiate_with_params(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CuResult {
    if params.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    instantiate(exec, graph)?;
    // SAFETY: `params` is non-NULL and points to a writable struct (driver API contract);
    // only the output fields are written.
    unsafe {
        std::ptr::addr_of_mut!((*params).hErrNode_out).write_unaligned(std::ptr::null_mut());
        std::ptr::addr_of_mut!((*params).result_out)
            .write_unaligned(CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_SUCCESS);
    }
    Ok(())
}

/// The upload stream is ignored; `result_out` is always success.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CUresult {
    entry(|| instantiate_with_params(exec, graph, params))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithParams_ptsz(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CUresult {
    entry(|| instantiate_with_params(exec, graph, params))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult {
    entry(|| {
        process::with(|p| {
            p.graph_execs
                .remove(&(exec as u64))
                .map(|_| ())
                .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
        })
    })
}

/// All the graph's kernels, back to back on the stream.
fn graph_launch(exec: CUgraphExec, stream: CUstream, per_thread: bool) -> CuResult {
    process::with(|p| {
        let e = p
            .graph_execs
            .get(&(exec as u64))
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let (ctx, kernels) = (e.ctx, e.kernels.clone());
        let key = p.stream_key(stream, per_thread)?;
        if key.ctx != ctx {
            return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
        }
        p.submit(key, &kernels)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult {
    entry(|| graph_launch(exec, stream, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult {
    entry(|| graph_launch(exec, stream, true))
}
