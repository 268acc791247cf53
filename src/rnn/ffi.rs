//! The C calls of the RNN family and the owners of its descriptors.
#![allow(non_snake_case)]
use std::ffi::{c_int, c_void};

use cudnn_safe_sys as sys;

crate::raw::raw_fns! {
    fn cudnnCreateRNNDescriptor(desc: *mut sys::cudnnRNNDescriptor_t);
    fn cudnnDestroyRNNDescriptor(desc: sys::cudnnRNNDescriptor_t);
    fn cudnnSetRNNDescriptor_v8(
        desc: sys::cudnnRNNDescriptor_t,
        algo: sys::cudnnRNNAlgo_t,
        cell_mode: sys::cudnnRNNMode_t,
        bias_mode: sys::cudnnRNNBiasMode_t,
        dir_mode: sys::cudnnDirectionMode_t,
        input_mode: sys::cudnnRNNInputMode_t,
        data_type: sys::cudnnDataType_t,
        math_prec: sys::cudnnDataType_t,
        math_type: sys::cudnnMathType_t,
        input_size: i32,
        hidden_size: i32,
        proj_size: i32,
        num_layers: i32,
        dropout: sys::cudnnDropoutDescriptor_t,
        aux_flags: u32,
    );
    fn cudnnCreateRNNDataDescriptor(desc: *mut sys::cudnnRNNDataDescriptor_t);
    fn cudnnDestroyRNNDataDescriptor(desc: sys::cudnnRNNDataDescriptor_t);
    fn cudnnSetRNNDataDescriptor(
        desc: sys::cudnnRNNDataDescriptor_t,
        data_type: sys::cudnnDataType_t,
        layout: sys::cudnnRNNDataLayout_t,
        max_seq_length: c_int,
        batch_size: c_int,
        vector_size: c_int,
        seq_length_array: *const c_int,
        padding_fill: *mut c_void,
    );
    fn cudnnGetRNNWeightSpaceSize(
        handle: sys::cudnnHandle_t,
        desc: sys::cudnnRNNDescriptor_t,
        bytes: *mut usize,
    );
    fn cudnnGetRNNWeightParams(
        handle: sys::cudnnHandle_t,
        desc: sys::cudnnRNNDescriptor_t,
        pseudo_layer: i32,
        weight_space_size: usize,
        weight_space: *const c_void,
        lin_layer_id: i32,
        m_desc: sys::cudnnTensorDescriptor_t,
        m_addr: *mut *mut c_void,
        b_desc: sys::cudnnTensorDescriptor_t,
        b_addr: *mut *mut c_void,
    );
    fn cudnnGetRNNTempSpaceSizes(
        handle: sys::cudnnHandle_t,
        desc: sys::cudnnRNNDescriptor_t,
        mode: sys::cudnnForwardMode_t,
        x_desc: sys::cudnnRNNDataDescriptor_t,
        workspace_bytes: *mut usize,
        reserve_bytes: *mut usize,
    );
    fn cudnnRNNForward(
        handle: sys::cudnnHandle_t,
        desc: sys::cudnnRNNDescriptor_t,
        mode: sys::cudnnForwardMode_t,
        dev_seq_lengths: *const i32,
        x_desc: sys::cudnnRNNDataDescriptor_t,
        x: *const c_void,
        y_desc: sys::cudnnRNNDataDescriptor_t,
        y: *mut c_void,
        h_desc: sys::cudnnTensorDescriptor_t,
        hx: *const c_void,
        hy: *mut c_void,
        c_desc: sys::cudnnTensorDescriptor_t,
        cx: *const c_void,
        cy: *mut c_void,
        weight_space_size: usize,
        weight_space: *const c_void,
        workspace_size: usize,
        workspace: *mut c_void,
        reserve_size: usize,
        reserve: *mut c_void,
    );
    fn cudnnRNNBackwardData_v8(
        handle: sys::cudnnHandle_t,
        desc: sys::cudnnRNNDescriptor_t,
        dev_seq_lengths: *const i32,
        y_desc: sys::cudnnRNNDataDescriptor_t,
        y: *const c_void,
        dy: *const c_void,
        x_desc: sys::cudnnRNNDataDescriptor_t,
        dx: *mut c_void,
        h_desc: sys::cudnnTensorDescriptor_t,
        hx: *const c_void,
        dhy: *const c_void,
        dhx: *mut c_void,
        c_desc: sys::cudnnTensorDescriptor_t,
        cx: *const c_void,
        dcy: *const c_void,
        dcx: *mut c_void,
        weight_space_size: usize,
        weight_space: *const c_void,
        workspace_size: usize,
        workspace: *mut c_void,
        reserve_size: usize,
        reserve: *mut c_void,
    );
    fn cudnnRNNBackwardWeights_v8(
        handle: sys::cudnnHandle_t,
        desc: sys::cudnnRNNDescriptor_t,
        add_grad: sys::cudnnWgradMode_t,
        dev_seq_lengths: *const i32,
        x_desc: sys::cudnnRNNDataDescriptor_t,
        x: *const c_void,
        h_desc: sys::cudnnTensorDescriptor_t,
        hx: *const c_void,
        y_desc: sys::cudnnRNNDataDescriptor_t,
        y: *const c_void,
        weight_space_size: usize,
        dweight_space: *mut c_void,
        workspace_size: usize,
        workspace: *mut c_void,
        reserve_size: usize,
        reserve: *mut c_void,
    );
    fn cudnnGetTensorNdDescriptor(
        desc: sys::cudnnTensorDescriptor_t,
        nb_dims_requested: c_int,
        data_type: *mut sys::cudnnDataType_t,
        nb_dims: *mut c_int,
        dims: *mut c_int,
        strides: *mut c_int,
    );
}

crate::raw::owned_descriptor!(
    /// An owned `cudnnRNNDescriptor_t`.
    OwnedRnn,
    sys::cudnnRNNDescriptor_t,
    cudnnCreateRNNDescriptor,
    cudnnDestroyRNNDescriptor
);
crate::raw::owned_descriptor!(
    /// An owned `cudnnRNNDataDescriptor_t`.
    OwnedRnnData,
    sys::cudnnRNNDataDescriptor_t,
    cudnnCreateRNNDataDescriptor,
    cudnnDestroyRNNDataDescriptor
);
