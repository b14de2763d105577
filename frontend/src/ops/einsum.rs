//! `torch.einsum` for equations over single-letter subscripts (no `...`): a parser and a
//! lowering to `diagonal` (a letter repeated in one operand), `sum` (a letter no later operand
//! or the output uses), `permute` / `reshape` and `bmm`, contracting the operands left to right.

use crate::ops::composite::CompositeScope;
use crate::tensor::Tensor;
use coil_ir::{Error, Result};
use std::panic::Location;

/// An operand with one subscript letter per dim.
struct Labeled {
    t: Tensor,
    letters: Vec<char>,
}

fn parse(equation: &str, n: usize) -> std::result::Result<(Vec<Vec<char>>, Vec<char>), String> {
    let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    if eq.contains("...") {
        return Err("ellipsis (`...`) is not supported; name every dim with a letter".into());
    }
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let inputs: Vec<Vec<char>> = lhs.split(',').map(|s| s.chars().collect()).collect();
    if inputs.len() != n {
        return Err(format!("{} operands were provided, but the equation has {} subscripts", n, inputs.len()));
    }
    let all: Vec<char> = inputs.iter().flatten().copied().collect();
    let mut named = all.iter().copied().chain(rhs.iter().flat_map(|r| r.chars().collect::<Vec<_>>()));
    if let Some(c) = named.find(|c| !c.is_ascii_alphabetic()) {
        return Err(format!("invalid subscript '{c}': subscripts must be letters"));
    }
    let output: Vec<char> = match rhs {
        Some(r) => {
            let out: Vec<char> = r.chars().collect();
            for (i, c) in out.iter().enumerate() {
                if out[..i].contains(c) {
                    return Err(format!("output subscript {c} appears more than once in the output"));
                }
                if !all.contains(c) {
                    return Err(format!("output subscript {c} does not appear in the equation for any input operand"));
                }
            }
            out
        }
        None => {
            // Implicit output: the letters used exactly once, in alphabetical order.
            let mut once: Vec<char> =
                all.iter().copied().filter(|c| all.iter().filter(|d| *d == c).count() == 1).collect();
            once.sort_unstable();
            once
        }
    };
    Ok((inputs, output))
}

impl Labeled {
    /// Takes the diagonal of every letter that appears twice, and sums away the letters that
    /// `keep` refuses (used nowhere later).
    fn simplify(mut self, keep: &dyn Fn(char) -> bool) -> Result<Labeled> {
        while let Some((p, q)) = repeated(&self.letters) {
            let c = self.letters[p];
            self.t = self.t.diagonal(0, p as i64, q as i64)?;
            self.letters.remove(q);
            self.letters.remove(p);
            self.letters.push(c);
        }
        let drop: Vec<i64> = (0..self.letters.len()).filter(|&d| !keep(self.letters[d])).map(|d| d as i64).collect();
        if !drop.is_empty() {
            self.t = self.t.sum(&drop, false)?;
            self.letters.retain(|&c| keep(c));
        }
        Ok(self)
    }

    fn size(&self, c: char) -> usize {
        self.t.shape()[self.letters.iter().position(|&l| l == c).expect("a letter of this operand")]
    }

    /// This operand permuted to the letters of `groups` in order, each group of dims merged
    /// into one.
    fn grouped(&self, groups: &[&[char]]) -> Result<Tensor> {
        let perm: Vec<i64> = groups
            .iter()
            .flat_map(|g| g.iter())
            .map(|c| self.letters.iter().position(|l| l == c).expect("a letter of this operand") as i64)
            .collect();
        let shape: Vec<i64> = groups.iter().map(|g| g.iter().map(|&c| self.size(c) as i64).product()).collect();
        self.t.permute(&perm)?.reshape(&shape)
    }
}

fn repeated(letters: &[char]) -> Option<(usize, usize)> {
    (0..letters.len()).find_map(|q| letters[..q].iter().position(|&c| c == letters[q]).map(|p| (p, q)))
}

/// Contracts two simplified operands: the shared letters in `keep` stay (batch dims of a
/// `bmm`), the other shared letters are summed over. The result's letters are the batch
/// letters, `a`'s own, then `b`'s own.
fn contract(a: Labeled, b: Labeled, keep: &[char]) -> Result<Labeled> {
    let shared: Vec<char> = a.letters.iter().copied().filter(|c| b.letters.contains(c)).collect();
    let left: Vec<char> = a.letters.iter().copied().filter(|c| !b.letters.contains(c)).collect();
    let right: Vec<char> = b.letters.iter().copied().filter(|c| !a.letters.contains(c)).collect();
    let (batch, summed): (Vec<char>, Vec<char>) = shared.iter().partition(|c| keep.contains(c));
    let x = a.grouped(&[&batch, &left, &summed])?;
    let y = b.grouped(&[&batch, &summed, &right])?;
    let mut shape: Vec<i64> = batch.iter().map(|&c| a.size(c) as i64).collect();
    shape.extend(left.iter().map(|&c| a.size(c) as i64));
    shape.extend(right.iter().map(|&c| b.size(c) as i64));
    let t = x.bmm(&y)?.reshape(&shape)?;
    let letters = batch.iter().chain(&left).chain(&right).copied().collect();
    Ok(Labeled { t, letters })
}

/// `torch.einsum(equation, operands)`: products summed over the subscripts the output leaves out,
/// e.g. `"ij,jk->ik"` (matmul), `"bij,bjk->bik"`, `"ii->i"` (diagonal), `"ij->"` (sum), `"i,j->ij"`
/// (outer). Without `->` the output is the letters used once, in alphabetical order.
///
/// ```
/// use coil_frontend::{ops::einsum::einsum, Tensor};
/// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
/// let b = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], &[2, 2])?;
/// assert_eq!(einsum("ij,jk->ik", &[&a, &b])?.to_vec::<f32>()?, vec![1.0, 2.0, 3.0, 4.0]);
/// assert_eq!(einsum("ii", &[&a])?.item::<f32>()?, 5.0);
/// assert_eq!(einsum("ij->ji", &[&a])?.to_vec::<f32>()?, vec![1.0, 3.0, 2.0, 4.0]);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[track_caller]
pub fn einsum(equation: &str, operands: &[&Tensor]) -> Result<Tensor> {
    let loc = Location::caller();
    let _scope = CompositeScope::enter("einsum", operands, loc);
    let fail = |msg: String| Err(Tensor::error("einsum", operands, Error::value(format!("einsum(): {msg}")), loc));
    let (inputs, output) = match parse(equation, operands.len()) {
        Ok(p) => p,
        Err(msg) => return fail(msg),
    };
    if operands.is_empty() {
        return fail("must provide at least one operand".into());
    }
    let mut sizes: Vec<(char, usize)> = Vec::new();
    for (letters, t) in inputs.iter().zip(operands) {
        if letters.len() != t.rank() {
            return fail(format!(
                "the number of subscripts in the equation ({}) does not match the number of dimensions ({}) of operand {}",
                letters.len(),
                t.rank(),
                t.meta()
            ));
        }
        for (&c, &s) in letters.iter().zip(t.shape()) {
            match sizes.iter().find(|(l, _)| *l == c) {
                Some(&(_, size)) if size != s => {
                    return fail(format!("subscript {c} has size {s} in one operand and {size} in another"));
                }
                Some(_) => {}
                None => sizes.push((c, s)),
            }
        }
    }
    let mut rest: Vec<Labeled> =
        inputs.into_iter().zip(operands).map(|(letters, t)| Labeled { t: (*t).clone(), letters }).collect();
    rest.reverse();
    let needed_after = |rest: &[Labeled], c: char| output.contains(&c) || rest.iter().any(|o| o.letters.contains(&c));
    let first = rest.pop().expect("one operand");
    let mut acc = first.simplify(&|c| needed_after(&rest, c))?;
    while let Some(next) = rest.pop() {
        let acc_letters = acc.letters.clone();
        let next = next.simplify(&|c| needed_after(&rest, c) || acc_letters.contains(&c))?;
        let keep: Vec<char> = acc.letters.iter().copied().filter(|&c| needed_after(&rest, c)).collect();
        acc = contract(acc, next, &keep)?;
        let rest_ref = &rest;
        acc = acc.simplify(&|c| needed_after(rest_ref, c))?;
    }
    let acc = acc.simplify(&|c| output.contains(&c))?;
    let perm: Vec<i64> = output
        .iter()
        .map(|c| acc.letters.iter().position(|l| l == c).expect("output letters survive") as i64)
        .collect();
    if perm.is_empty() {
        return Ok(acc.t);
    }
    acc.t.permute(&perm)
}
