//! The one dispatch mechanism, [`kernels!`]: each concern (rows, attention, GEMM, int8) invokes it
//! for its own kernels. A body is plain Rust over slices, `#[inline(always)]`; the generated
//! `#[target_feature]` copies only change what the compiler may emit for it (FMA, 256- and 512-bit
//! vectors), never the order of the arithmetic. The macro names [`crate::isa`] and the lanes of
//! [`crate::lanes`] by absolute paths, so an invoking module imports nothing for it but the macro.

/// Each entry `[unsafe] fn name(args) -> R = LANES_BODY, SCALAR_BODY;` makes the dispatcher
/// `name(isa, args)` and, per x86 ISA, a module holding its lanes as `L` (two AVX2 registers, one
/// AVX-512 register) and a `#[target_feature]` copy that calls `LANES_BODY`, a path that may name
/// `L`. A kernel may take one type parameter (`fn name<K: Bound>(…)`), so that what it reads
/// through is inlined into each ISA's copy. One feature set per ISA; the bodies' arithmetic is
/// fixed, only the registers and instructions differ. For `unsafe` kernels the caller upholds the
/// body's contract.
macro_rules! kernels {
    ($( [$($kw:tt)*] fn $name:ident $(< $g:ident : $gb:path >)? ( $($a:ident : $t:ty),* $(,)? ) $(-> $r:ty)?
        = $lanes:path, $scalar:path ; )*) => {
        $(
            #[allow(clippy::too_many_arguments, unused_unsafe)] // the bodies' own signatures
            pub(crate) $($kw)* fn $name $(<$g: $gb>)? (isa: $crate::isa::Isa, $($a: $t),*) $(-> $r)? {
                match isa.0 {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: an `Isa` of kind Avx2Fma is only made by `Isa::available` after the
                    // CPU reported AVX2, FMA and F16C (the caller upholds the body's contract).
                    $crate::isa::Kind::Avx2Fma => unsafe { avx2::$name($($a),*) },
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: an `Isa` of kind Avx512 is only made after the CPU reported AVX-512
                    // F, BW, VL and VNNI besides AVX2, FMA and F16C (as above).
                    $crate::isa::Kind::Avx512 => unsafe { avx512::$name($($a),*) },
                    // SAFETY: the plain body; the caller upholds its contract.
                    $crate::isa::Kind::Scalar => unsafe { $scalar($($a),*) },
                }
            }
        )*
        $crate::dispatch::kernels!(@module avx2, $crate::lanes::avx2::Y, "avx2,fma,f16c",
            $( fn $name $(<$g : $gb>)? ( $($a : $t),* ) $(-> $r)? = $lanes ; )*);
        $crate::dispatch::kernels!(@module avx512, $crate::lanes::avx512::Z,
            "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
            $( fn $name $(<$g : $gb>)? ( $($a : $t),* ) $(-> $r)? = $lanes ; )*);
    };
    (@module $module:ident, $lanes_ty:ty, $features:literal,
        $( fn $name:ident $(< $g:ident : $gb:path >)? ( $($a:ident : $t:ty),* ) $(-> $r:ty)? = $lanes:path ; )*) => {
        #[cfg(target_arch = "x86_64")]
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            /// This ISA's lanes: what the generic bodies are compiled with here.
            #[allow(dead_code)] // bodies that are not generic over lanes (the row kernels) skip it
            type L = $lanes_ty;
            $(
                #[allow(clippy::too_many_arguments, unused_unsafe)] // the bodies' own signatures
                #[target_feature(enable = $features)]
                pub(super) unsafe fn $name $(<$g: $gb>)? ($($a: $t),*) $(-> $r)? {
                    // SAFETY: the caller (the dispatcher) upholds the body's contract.
                    unsafe { $lanes($($a),*) }
                }
            )*
        }
    };
}

pub(crate) use kernels;
