pub mod alloc_shared_memory;
pub mod annotate_buffer_visibility;
pub mod inst_combine;
pub mod mem2reg;
pub mod sccp;
pub mod simple_cse;
pub mod sroa;
pub mod uniformity;
