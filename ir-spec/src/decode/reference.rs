//! The oracle of the derived programs: the forward program's next-token logits after a window
//! of tokens, evaluated by the interpreter.

use std::collections::HashMap;

use crate::graph::Graph;
use crate::interp::{EvalError, Tensor, evaluate};

/// The logits that the forward program `forward` (from [`super::forward_part`], token ids
/// `ids`, logits batch first) gives after the last token of each of `windows` (of one length,
/// at most the context), with params and states `persistent`. Windows run a batch at a time,
/// padded with token 0 past their length and in the batch's unused rows; the program is causal,
/// so the padding changes nothing before it.
pub fn reference_logits(
    forward: &Graph,
    ids: &str,
    persistent: &HashMap<String, Tensor>,
    windows: &[Vec<i32>],
) -> Result<Vec<Vec<f64>>, EvalError> {
    let v = forward.lookup(ids).expect("the forward part has the ids");
    let (b, t) = (forward.ty(v).shape[0], forward.ty(v).shape[1]);
    let len = windows.first().map_or(0, Vec::len);
    let mut out = Vec::new();
    for chunk in windows.chunks(b) {
        let mut data = vec![0i64; b * t];
        for (r, row) in chunk.iter().enumerate() {
            for (i, &tok) in row.iter().enumerate() {
                data[r * t + i] = i64::from(tok);
            }
        }
        let inputs = HashMap::from([(ids.to_string(), Tensor::i32(vec![b, t], data))]);
        let run = evaluate(forward, &inputs, persistent)?;
        let logits = &run.outputs[0].1;
        let vocab = logits.numel() / (b * t);
        for r in 0..chunk.len() {
            let at = (r * t + len - 1) * vocab;
            out.push(logits.data[at..at + vocab].to_vec());
        }
    }
    Ok(out)
}
