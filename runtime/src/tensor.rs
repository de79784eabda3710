//! Host tensors: row-major float64 arrays with a shape.

#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

impl Tensor {
    pub fn new(shape: Vec<usize>, data: Vec<f64>) -> Tensor {
        assert_eq!(shape.iter().product::<usize>(), data.len(), "tensor data does not fill its shape");
        Tensor { shape, data }
    }
    pub fn zeros(shape: Vec<usize>) -> Tensor {
        let n = shape.iter().product();
        Tensor { shape, data: vec![0.0; n] }
    }
    pub fn len(&self) -> usize {
        self.data.len()
    }
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
    /// The index along each axis of the entry at row-major position `flat`.
    pub fn index_of(&self, flat: usize) -> Vec<usize> {
        let mut index = vec![0; self.shape.len()];
        let mut rest = flat;
        for axis in (0..self.shape.len()).rev() {
            index[axis] = rest % self.shape[axis];
            rest /= self.shape[axis];
        }
        index
    }
    /// Where the tensor is not finite: the first such entry's row-major
    /// position and how many NaN and infinite values it holds; `None` when
    /// every value is finite.
    pub fn non_finite(&self) -> Option<(usize, usize, usize)> {
        let first = self.data.iter().position(|v| !v.is_finite())?;
        let nan = self.data.iter().filter(|v| v.is_nan()).count();
        Some((first, nan, self.data.iter().filter(|v| v.is_infinite()).count()))
    }
    /// What output `name` holds that is not finite, as `attnc run` and the
    /// Python package report it (counts, the first value and its index);
    /// `None` when every value is finite.
    pub fn describe_non_finite(&self, name: &str) -> Option<String> {
        let (first, nan, inf) = self.non_finite()?;
        Some(format!(
            "output `{name}` holds {nan} NaN and {inf} infinite value(s); the first, {}, at {:?}",
            self.data[first],
            self.index_of(first)
        ))
    }
    /// `self` and `other` joined along `axis` (every other axis equal): a
    /// key/value cache with a decode step's new rows appended, as the
    /// language's `concat`.
    pub fn concat(&self, other: &Tensor, axis: usize) -> Tensor {
        let mut shape = self.shape.clone();
        shape[axis] += other.shape[axis];
        let rows: usize = self.shape[..axis].iter().product();
        let (fa, fb): (usize, usize) = (self.shape[axis..].iter().product(), other.shape[axis..].iter().product());
        let data = (0..rows)
            .flat_map(|r| self.data[r * fa..(r + 1) * fa].iter().chain(&other.data[r * fb..(r + 1) * fb]).copied())
            .collect();
        Tensor::new(shape, data)
    }
}

/// ‖a − b‖₂ / ‖b‖₂ (with ‖b‖ = 0 giving ‖a‖); NaN anywhere gives NaN, so a
/// `<= tol` comparison fails on it.
pub fn relative_error(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "relative_error of tensors of different sizes");
    let (mut num, mut den) = (0.0, 0.0);
    for (x, y) in a.iter().zip(b) {
        num += (x - y) * (x - y);
        den += y * y;
    }
    if a.iter().chain(b).any(|v| v.is_nan()) {
        return f64::NAN;
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::Tensor;

    #[test]
    fn concat_joins_along_an_axis() {
        // [2, 1, 2] with [2, 2, 2] along axis 1: per leading index, a's row then b's.
        let a = Tensor::new(vec![2, 1, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let b = Tensor::new(vec![2, 2, 2], vec![5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0]);
        let c = a.concat(&b, 1);
        assert_eq!(c.shape, vec![2, 3, 2]);
        assert_eq!(c.data, vec![1.0, 2.0, 5.0, 6.0, 7.0, 8.0, 3.0, 4.0, 9.0, 10.0, 11.0, 12.0]);
        // Onto an empty cache.
        let empty = Tensor::new(vec![2, 0, 2], vec![]);
        assert_eq!(empty.concat(&a, 1), a);
    }
}
