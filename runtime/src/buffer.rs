//! Host buffers: a tensor's elements in row-major order, typed by dtype.
//!
//! ```
//! use coil_runtime::Buffer;
//! let b = Buffer::from_vec(vec![1.5f32, -2.0, 3.25], vec![3]);
//! assert_eq!(b.to_vec::<f64>(), vec![1.5, -2.0, 3.25]);
//! assert_eq!(b.to_vec::<i32>(), vec![1, -2, 3]); // converts like a cast
//! ```

use coil_ir::{DType, Error, Result, Shape, TensorMeta};
use half::{bf16, f16};

/// The elements of a host buffer.
#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
    /// `bool` elements, one byte each.
    Bool(Vec<bool>),
    /// `u8` elements.
    U8(Vec<u8>),
    /// `i8` elements.
    I8(Vec<i8>),
    /// `i16` elements.
    I16(Vec<i16>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// IEEE half-precision elements.
    F16(Vec<f16>),
    /// bfloat16 elements.
    BF16(Vec<bf16>),
    /// `f32` elements.
    F32(Vec<f32>),
    /// `f64` elements.
    F64(Vec<f64>),
}

/// A Rust type that is a tensor element.
pub trait Element: Copy + Send + Sync + 'static {
    /// The dtype of this element type.
    const DTYPE: DType;
    /// The value as an `f64` (bool: 0 or 1).
    fn to_f64(self) -> f64;
    /// Converts as a cast to this type does (floats to integers truncate; to bool: nonzero).
    fn from_f64(x: f64) -> Self;
    /// The value as an `i64`, as a cast does (floats truncate; bool: 0 or 1).
    fn to_i64(self) -> i64;
    /// Converts as a cast to this type does (integers wrap; to bool: nonzero).
    fn from_i64(x: i64) -> Self;
    /// The [`HostData`] holding `v`.
    fn wrap(v: Vec<Self>) -> HostData;
    /// The elements of `d` when it holds this type, else `None`.
    fn unwrap(d: &HostData) -> Option<&[Self]>;
}

macro_rules! element {
    ($t:ty, $dt:ident, $to:expr, $from:expr, $toi:expr, $fromi:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$dt;
            fn to_f64(self) -> f64 {
                ($to)(self)
            }
            fn from_f64(x: f64) -> Self {
                ($from)(x)
            }
            fn to_i64(self) -> i64 {
                ($toi)(self)
            }
            fn from_i64(x: i64) -> Self {
                ($fromi)(x)
            }
            fn wrap(v: Vec<Self>) -> HostData {
                HostData::$dt(v)
            }
            fn unwrap(d: &HostData) -> Option<&[Self]> {
                match d {
                    HostData::$dt(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}

// Integer conversions wrap like C casts; float -> integer truncates (as PyTorch's `.to()`).
element!(bool, Bool, |x: bool| x as i64 as f64, |x: f64| x != 0.0, |x: bool| x as i64, |x: i64| x != 0);
element!(u8, U8, |x: u8| x as f64, |x: f64| x as i64 as u8, |x: u8| x as i64, |x: i64| x as u8);
element!(i8, I8, |x: i8| x as f64, |x: f64| x as i64 as i8, |x: i8| x as i64, |x: i64| x as i8);
element!(i16, I16, |x: i16| x as f64, |x: f64| x as i64 as i16, |x: i16| x as i64, |x: i64| x as i16);
element!(i32, I32, |x: i32| x as f64, |x: f64| x as i64 as i32, |x: i32| x as i64, |x: i64| x as i32);
element!(i64, I64, |x: i64| x as f64, |x: f64| x as i64, |x: i64| x, |x: i64| x);
element!(f16, F16, |x: f16| x.to_f64(), f16::from_f64, |x: f16| x.to_f64() as i64, |x: i64| f16::from_f64(x as f64));
element!(bf16, BF16, |x: bf16| x.to_f64(), bf16::from_f64, |x: bf16| x.to_f64() as i64, |x: i64| bf16::from_f64(
    x as f64
));
element!(f32, F32, |x: f32| x as f64, |x: f64| x as f32, |x: f32| x as i64, |x: i64| x as f32);
element!(f64, F64, |x: f64| x, |x: f64| x, |x: f64| x as i64, |x: i64| x as f64);

/// Runs `$body` with `$v` bound to the typed slice of a [`HostData`].
#[macro_export]
macro_rules! with_host_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::HostData::Bool($v) => $body,
            $crate::HostData::U8($v) => $body,
            $crate::HostData::I8($v) => $body,
            $crate::HostData::I16($v) => $body,
            $crate::HostData::I32($v) => $body,
            $crate::HostData::I64($v) => $body,
            $crate::HostData::F16($v) => $body,
            $crate::HostData::BF16($v) => $body,
            $crate::HostData::F32($v) => $body,
            $crate::HostData::F64($v) => $body,
        }
    };
}

impl HostData {
    /// The dtype of the elements.
    pub fn dtype(&self) -> DType {
        with_host_data!(self, v => elem_dtype(v))
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        with_host_data!(self, v => v.len())
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Zero-filled data of a dtype, or an error when the host cannot allocate it (the
    /// outputs and temporaries of a run are made this way: never an abort).
    pub fn try_zeros(dtype: DType, len: usize) -> Result<HostData> {
        Ok(match dtype {
            DType::Bool => HostData::Bool(try_zeroed_vec(len)?),
            DType::U8 => HostData::U8(try_zeroed_vec(len)?),
            DType::I8 => HostData::I8(try_zeroed_vec(len)?),
            DType::I16 => HostData::I16(try_zeroed_vec(len)?),
            DType::I32 => HostData::I32(try_zeroed_vec(len)?),
            DType::I64 => HostData::I64(try_zeroed_vec(len)?),
            DType::F16 => HostData::F16(try_zeroed_vec(len)?),
            DType::BF16 => HostData::BF16(try_zeroed_vec(len)?),
            DType::F32 => HostData::F32(try_zeroed_vec(len)?),
            DType::F64 => HostData::F64(try_zeroed_vec(len)?),
        })
    }

    /// Data of a dtype for a run to write every element of (an output): memory a dropped
    /// buffer gave back ([`crate::host_pool`]), its values unspecified, or else zero-filled
    /// ([`HostData::try_zeros`]).
    /// A new one has room for more ([`crate::host_pool::capacity_for`]), so that the cache can
    /// serve a later, larger output with it.
    pub fn for_output(dtype: DType, len: usize) -> Result<HostData> {
        if let Some(data) = crate::host_pool::take(dtype, len) {
            return Ok(data);
        }
        let capacity = crate::host_pool::capacity_for(dtype, len);
        // (where the address space for the larger capacity is refused, the exact length)
        let mut data = HostData::try_zeros(dtype, capacity).or_else(|_| HostData::try_zeros(dtype, len))?;
        // all `capacity` elements are zeros (their pages not yet touched): cut to `len`
        with_host_data!(&mut data, v => v.truncate(len));
        Ok(data)
    }

    /// Every element as f64 (exact for every dtype but i64 beyond 2^53).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        with_host_data!(self, v => v.iter().map(|x| x.to_f64()).collect())
    }

    /// Every element as i64 (floats truncate).
    pub fn to_i64_vec(&self) -> Vec<i64> {
        with_host_data!(self, v => v.iter().map(|x| x.to_i64()).collect())
    }

    /// Data of `dtype` from f64 values, rounding as a cast does.
    pub fn from_f64_slice(dtype: DType, xs: &[f64]) -> HostData {
        fn conv<T: Element>(xs: &[f64]) -> HostData {
            T::wrap(xs.iter().map(|&x| T::from_f64(x)).collect())
        }
        dispatch_dtype(
            dtype,
            xs,
            conv::<bool>,
            conv::<u8>,
            conv::<i8>,
            conv::<i16>,
            conv::<i32>,
            conv::<i64>,
            conv::<f16>,
            conv::<bf16>,
            conv::<f32>,
            conv::<f64>,
        )
    }

    /// Data of `dtype` from i64 values, wrapping as a cast does.
    pub fn from_i64_slice(dtype: DType, xs: &[i64]) -> HostData {
        fn conv<T: Element>(xs: &[i64]) -> HostData {
            T::wrap(xs.iter().map(|&x| T::from_i64(x)).collect())
        }
        dispatch_dtype(
            dtype,
            xs,
            conv::<bool>,
            conv::<u8>,
            conv::<i8>,
            conv::<i16>,
            conv::<i32>,
            conv::<i64>,
            conv::<f16>,
            conv::<bf16>,
            conv::<f32>,
            conv::<f64>,
        )
    }

    /// Size of the elements in bytes (bool: one byte each).
    pub fn byte_len(&self) -> usize {
        self.len() * self.dtype().size_bytes()
    }

    /// Pointer to the first element's bytes, for compiled kernels (which see every dtype as raw
    /// bytes: bool as one byte 0/1, f16/bf16 as their 16 bits). Aligned for the element type.
    pub fn as_ptr(&self) -> *const u8 {
        with_host_data!(self, v => v.as_ptr().cast::<u8>())
    }

    /// Mutable pointer to the first element's bytes. Whoever writes through it must store valid
    /// elements (bool: only 0 or 1).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        with_host_data!(self, v => v.as_mut_ptr().cast::<u8>())
    }

    /// The raw bytes in the target's byte order, little-endian on every target coil runs on
    /// (bool as one byte 0/1), as safetensors stores them.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }

    /// The elements' bytes, borrowed (see [`HostData::to_bytes`]).
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            // A Rust `bool` is one byte holding 0 or 1, the layout kernels and files use.
            HostData::Bool(v) => {
                // SAFETY: `bool` has size and alignment 1 and every `bool` is a valid `u8`; the
                // slice borrows `v` for the returned lifetime.
                unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), v.len()) }
            }
            HostData::U8(v) => v,
            HostData::I8(v) => bytemuck::cast_slice(v),
            HostData::I16(v) => bytemuck::cast_slice(v),
            HostData::I32(v) => bytemuck::cast_slice(v),
            HostData::I64(v) => bytemuck::cast_slice(v),
            HostData::F16(v) => bytemuck::cast_slice(v),
            HostData::BF16(v) => bytemuck::cast_slice(v),
            HostData::F32(v) => bytemuck::cast_slice(v),
            HostData::F64(v) => bytemuck::cast_slice(v),
        }
    }

    /// Parses raw little-endian bytes of a dtype.
    pub fn from_bytes(dtype: DType, bytes: &[u8]) -> Result<HostData> {
        if !bytes.len().is_multiple_of(dtype.size_bytes()) {
            return Err(Error::value(format!("{} bytes is not a whole number of {dtype} elements", bytes.len())));
        }
        // One copy, whatever the source's alignment (a memory-mapped file's bytes may sit at
        // any offset).
        fn read<T: bytemuck::Pod>(bytes: &[u8]) -> Vec<T> {
            let n = bytes.len() / std::mem::size_of::<T>();
            let mut v: Vec<T> = Vec::with_capacity(n);
            // SAFETY: the capacity holds `n` elements, `bytes.len()` bytes (a whole number of
            // elements, checked above); `T` is `Pod`, so any bytes are a valid `T`; the source
            // is another allocation, so the ranges do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr().cast::<u8>(), bytes.len());
                v.set_len(n);
            }
            v
        }
        Ok(match dtype {
            DType::Bool => HostData::Bool(bytes.iter().map(|&b| b != 0).collect()),
            DType::U8 => HostData::U8(bytes.to_vec()),
            DType::I8 => HostData::I8(read(bytes)),
            DType::I16 => HostData::I16(read(bytes)),
            DType::I32 => HostData::I32(read(bytes)),
            DType::I64 => HostData::I64(read(bytes)),
            DType::F16 => HostData::F16(read(bytes)),
            DType::BF16 => HostData::BF16(read(bytes)),
            DType::F32 => HostData::F32(read(bytes)),
            DType::F64 => HostData::F64(read(bytes)),
        })
    }
}

fn elem_dtype<T: Element>(_: &[T]) -> DType {
    T::DTYPE
}

#[allow(clippy::too_many_arguments)]
fn dispatch_dtype<A: ?Sized>(
    dtype: DType,
    a: &A,
    b: fn(&A) -> HostData,
    u8_: fn(&A) -> HostData,
    i8_: fn(&A) -> HostData,
    i16_: fn(&A) -> HostData,
    i32_: fn(&A) -> HostData,
    i64_: fn(&A) -> HostData,
    f16_: fn(&A) -> HostData,
    bf16_: fn(&A) -> HostData,
    f32_: fn(&A) -> HostData,
    f64_: fn(&A) -> HostData,
) -> HostData {
    match dtype {
        DType::Bool => b(a),
        DType::U8 => u8_(a),
        DType::I8 => i8_(a),
        DType::I16 => i16_(a),
        DType::I32 => i32_(a),
        DType::I64 => i64_(a),
        DType::F16 => f16_(a),
        DType::BF16 => bf16_(a),
        DType::F32 => f32_(a),
        DType::F64 => f64_(a),
    }
}

/// `len` zeroed elements (lazily zeroed pages, as `vec![0; len]`), or an error naming the
/// bytes when the host cannot allocate them: an allocation failure is an error, not an abort.
///
/// ```
/// use coil_runtime::buffer::try_zeroed_vec;
/// assert_eq!(try_zeroed_vec::<f32>(3).unwrap(), vec![0.0; 3]);
/// assert!(try_zeroed_vec::<u64>(1 << 60).is_err());
/// ```
pub fn try_zeroed_vec<T: bytemuck::Zeroable>(len: usize) -> Result<Vec<T>> {
    if len == 0 || std::mem::size_of::<T>() == 0 {
        return Ok(Vec::new());
    }
    let bytes = len.saturating_mul(std::mem::size_of::<T>());
    let layout = std::alloc::Layout::array::<T>(len).map_err(|_| out_of_memory(bytes))?;
    // SAFETY: the layout has a non-zero size (checked above).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        return Err(out_of_memory(bytes));
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout of `len` elements of
    // `T` (the layout `Vec` frees with), and all-zero bytes are a valid `T` (`Zeroable`).
    Ok(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

/// Checks that the host can allocate `bytes` now (for code that builds its values through
/// iterators, such as the interpreter): an error naming the bytes instead of an abort later.
/// A check, not a reservation: the memory is given back at once.
pub fn check_allocation(bytes: usize) -> Result<()> {
    let mut probe: Vec<u8> = Vec::new();
    probe.try_reserve_exact(bytes).map_err(|_| out_of_memory(bytes))
}

/// The error of a host allocation that failed.
pub fn out_of_memory(bytes: usize) -> Error {
    Error::runtime(format!("out of memory: cannot allocate {bytes} bytes on the host"))
}

/// A contiguous tensor in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Buffer {
    /// The tensor's shape.
    pub shape: Shape,
    /// The elements in row-major order (as many as the shape has).
    pub data: HostData,
}

/// A large buffer's memory goes to the host cache ([`crate::host_pool`]) for the next run's
/// outputs.
impl Drop for Buffer {
    fn drop(&mut self) {
        if self.data.len() * self.data.dtype().size_bytes() >= crate::host_pool::MIN_BYTES {
            crate::host_pool::give(std::mem::replace(&mut self.data, HostData::U8(Vec::new())));
        }
    }
}

impl Buffer {
    /// A buffer from row-major values. Panics if `data.len()` is not the shape's element count.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: Shape) -> Buffer {
        assert_eq!(data.len(), coil_ir::graph::numel(&shape), "data length does not match shape {shape:?}");
        Buffer { shape, data: T::wrap(data) }
    }

    /// A buffer from data whose length must match the shape.
    pub fn new(shape: Shape, data: HostData) -> Result<Buffer> {
        let n = coil_ir::graph::numel(&shape);
        if data.len() != n {
            return Err(Error::shape(format!("{} elements do not fill shape {shape:?} ({n} elements)", data.len())));
        }
        Ok(Buffer { shape, data })
    }

    /// The elements' dtype.
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// The elements, taken out of the buffer (which then caches nothing: see its `Drop`).
    pub fn into_data(mut self) -> HostData {
        std::mem::replace(&mut self.data, HostData::U8(Vec::new()))
    }

    /// The shape and dtype.
    pub fn meta(&self) -> TensorMeta {
        TensorMeta::new(self.shape.clone(), self.dtype())
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// The elements converted to `T` as a cast would.
    pub fn to_vec<T: Element>(&self) -> Vec<T> {
        if let Some(v) = T::unwrap(&self.data) {
            return v.to_vec();
        }
        if T::DTYPE.is_float() || self.dtype().is_float() {
            with_host_data!(&self.data, v => v.iter().map(|x| T::from_f64(x.to_f64())).collect())
        } else {
            with_host_data!(&self.data, v => v.iter().map(|x| T::from_i64(x.to_i64())).collect())
        }
    }
}
