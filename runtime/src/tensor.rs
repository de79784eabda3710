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
