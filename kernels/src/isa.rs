//! The instruction sets the kernels are compiled for, and which of them this CPU has. Imports
//! nothing: every other module stands on it.

/// Which compiled copy of the kernel bodies runs. Only [`Isa::scalar`], [`Isa::detect`] and
/// [`Isa::available`] make one, so a SIMD path is only ever chosen on a CPU that has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Isa(pub(crate) Kind);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
    /// AVX-512 F, BW, VL and VNNI on top of AVX2 + FMA + F16C: the packed matmul and attention
    /// in 512-bit registers, W8A8 with `vpdpbusd`; the other kernels are the AVX2 bodies compiled
    /// with these features. (An AVX-512 CPU without VNNI, as Skylake-SP, runs the AVX2 path.)
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Isa {
    /// The plain compilation: the reference every other path is tested against. On aarch64 it is
    /// already NEON code, since NEON and FMA are part of the baseline there.
    pub fn scalar() -> Isa {
        Isa(Kind::Scalar)
    }

    /// The best instruction set this CPU supports. Call once and keep the value.
    pub fn detect() -> Isa {
        *Isa::available().last().expect("the scalar path is always available")
    }

    /// Every instruction set usable on this CPU, the scalar reference first, the best last.
    pub fn available() -> Vec<Isa> {
        #[allow(unused_mut)]
        let mut v = vec![Isa::scalar()];
        #[cfg(target_arch = "x86_64")]
        {
            use std::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") && has!("f16c") {
                v.push(Isa(Kind::Avx2Fma));
                if has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni") {
                    v.push(Isa(Kind::Avx512));
                }
            }
        }
        v
    }

    /// The available instruction set called `name` (as [`Isa::name`] spells it).
    pub fn by_name(name: &str) -> Option<Isa> {
        Isa::available().into_iter().find(|i| i.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self.0 {
            Kind::Scalar => "scalar",
            #[cfg(target_arch = "x86_64")]
            Kind::Avx2Fma => "avx2+fma",
            #[cfg(target_arch = "x86_64")]
            Kind::Avx512 => "avx512",
        }
    }
}

/// The SIMD-related features this CPU reports (for benchmark headers).
pub fn cpu_features() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut v = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($f:tt),*) => { $( if std::is_x86_feature_detected!($f) { v.push($f); } )* };
        }
        probe!("sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vnni", "avx512bf16", "avx512fp16");
    }
    #[cfg(target_arch = "aarch64")]
    {
        v.push("neon");
    }
    v
}
