//! A thin, owned layer over the CUDA driver API (cudarc's `sys` bindings, loaded at
//! run time), with exactly what the agent needs: contexts keyed by PCI address,
//! buffers, streams, events, PTX modules, peer access, IPC and NCCL (`nccl`, libnccl
//! loaded at run time too).

mod driver;
mod gate;
mod gpu;
pub mod ipc;
mod memory;
mod module;
pub mod nccl;
pub mod peers;
mod stream;

pub use driver::{driver_version, init, prefer_one_work_queue, CudaError};
pub use gate::HostGate;
pub use gpu::{parse_bus_id, reset_contexts, time_plain_context, Gpu};
pub use memory::DeviceBuffer;
pub use module::{KernelEntry, Module, Param, ParamType};
pub use stream::{Event, Stream};
