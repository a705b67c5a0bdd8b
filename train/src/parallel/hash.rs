//! Hashes that tell whether replicas agree: the parameters' bytes, and the settings every rank
//! must share.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use ember_model::LanguageModel;

use crate::config::{Devices, RunConfig};

/// FNV-1a's 64-bit offset basis: the hash of no bytes.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// 64-bit FNV-1a (Fowler–Noll–Vo): `hash` continued over `bytes`.
fn fnv1a(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// A 64-bit FNV-1a hash of every parameter's bytes in module order: equal on two replicas
/// exactly when their parameters are bit-identical (up to hash collisions).
pub fn param_hash<B: Backend>(model: &LanguageModel<B>) -> u64 {
    struct Hash(u64);
    impl<B: Backend> ModuleVisitor<B> for Hash {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0 = fnv1a(self.0, param.val().into_data().as_bytes());
        }
    }
    let mut hash = Hash(FNV_OFFSET);
    model.visit(&mut hash);
    hash.0
}

/// A 64-bit FNV-1a hash of `text` (run settings that every rank must share).
pub fn text_hash(text: &str) -> u64 {
    fnv1a(FNV_OFFSET, text.as_bytes())
}

/// The hash of the settings every rank must share: the whole resolved configuration as TOML,
/// less what may differ from node to node — where the data and weights lie on this machine
/// (`data`, `init_from`), which devices it uses (`device`, `devices` beyond their count), its
/// own address and rank (`parallel.node_rank`, `node_address`, `data_port`,
/// `start_coordinator`) and its peak FLOP/s. A setting added to the schema is checked without
/// being listed here.
pub fn settings_hash(config: &RunConfig) -> u64 {
    let mut shared = config.clone();
    shared.data = None;
    shared.init_from = None;
    shared.device = 0;
    shared.devices = Devices::Count(config.devices.count());
    shared.peak_flops = None;
    shared.parallel.node_rank = 0;
    shared.parallel.node_address.clear();
    shared.parallel.data_port = None;
    shared.parallel.start_coordinator = true;
    text_hash(&shared.to_toml())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn config(overrides: &[&str]) -> RunConfig {
        let text = "max_steps = 5\nmicro_batch_size = 2\n[model]\npreset = \"tiny\"\nvocab_size = 64\n";
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        RunConfig::from_toml_str(text, Path::new("run.toml"), &overrides).unwrap()
    }

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        // From the FNV reference test suite (Fowler, Noll, Vo): "" and "a".
        assert_eq!(text_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(text_hash("a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn settings_hash_covers_shared_keys_and_ignores_node_local_ones() {
        let base = settings_hash(&config(&["parallel.nodes=2"]));
        for shared in [
            "micro_batch_size=3",
            "optimizer.lr=0.1",
            "model.dropout=0.2",
            "log_every=7",
            "document_masking=true",
        ] {
            assert_ne!(settings_hash(&config(&["parallel.nodes=2", shared])), base, "{shared} is shared");
        }
        for local in
            ["parallel.node_rank=1", "data=\"/elsewhere\"", "parallel.node_address=\"10.0.0.2\"", "device=3"]
        {
            assert_eq!(settings_hash(&config(&["parallel.nodes=2", local])), base, "{local} is node-local");
        }
    }
}
