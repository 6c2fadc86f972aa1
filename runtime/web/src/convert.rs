//! Between JS values and host tensors: typed arrays in, typed arrays out, shapes from the
//! manifest.

use js_sys::{Array, Float32Array, Int32Array, Object, Reflect};
use sinter_artifact::artifact::{Role, TensorSlot};
use sinter_artifact::{DType, TensorType};
use sinter_runtime::io::{HostTensor, TensorData};
use wasm_bindgen::{JsCast, JsValue};

use crate::error::{WebError, js_message};

/// The inputs of `session` from a JS object of typed arrays, each with its slot's shape. A
/// name that is no input becomes a placeholder, so that the runtime's own message (which names
/// the graph's inputs) reports it.
pub(crate) fn feeds(
    session: &sinter_runtime::Session,
    inputs: &Object,
) -> Result<Vec<(String, HostTensor)>, WebError> {
    let mut out = Vec::new();
    for key in Object::keys(inputs).iter() {
        let name = key.as_string().unwrap_or_default();
        let value = get(inputs, &key)?;
        let slot = session.inputs().find(|s| s.name == name);
        let t = match slot {
            Some(slot) => host_tensor(&name, &slot.ty, &value)?,
            None => HostTensor::f32(vec![0], Vec::new()),
        };
        out.push((name, t));
    }
    Ok(out)
}

/// Borrowed views of named tensors, as the runtime's calls take them.
pub(crate) fn named(feeds: &[(String, HostTensor)]) -> Vec<(&str, &HostTensor)> {
    feeds.iter().map(|(n, t)| (n.as_str(), t)).collect()
}

/// `value` as a tensor of type `ty`, or an error naming the input, the type and what came.
fn host_tensor(name: &str, ty: &TensorType, value: &JsValue) -> Result<HostTensor, WebError> {
    let data = match ty.dtype {
        DType::F32 => value
            .dyn_ref::<Float32Array>()
            .map(|a| TensorData::F32(a.to_vec())),
        DType::I32 => value
            .dyn_ref::<Int32Array>()
            .map(|a| TensorData::I32(a.to_vec())),
        // JavaScript's Float16Array is not in every browser: f16 tensors travel as f32
        DType::F16 => value
            .dyn_ref::<Float32Array>()
            .map(|a| TensorData::F16(a.to_vec().into_iter().map(half::f16::from_f32).collect())),
    };
    let Some(data) = data else {
        return Err(WebError::InputKind {
            name: name.to_string(),
            expected: ty.clone(),
            found: describe(value),
        });
    };
    if data.len() != ty.numel() {
        return Err(WebError::InputLength {
            name: name.to_string(),
            expected: ty.clone(),
            actual: data.len(),
        });
    }
    Ok(HostTensor {
        shape: ty.shape.to_vec(),
        data,
    })
}

/// What a JS value is, for an error message.
fn describe(value: &JsValue) -> String {
    if value.is_instance_of::<Float32Array>() {
        "a Float32Array".into()
    } else if value.is_instance_of::<Int32Array>() {
        "an Int32Array".into()
    } else if Array::is_array(value) {
        "an Array (wrap it: Float32Array.from(a) or Int32Array.from(a))".into()
    } else if value.is_undefined() {
        "undefined".into()
    } else if value.is_null() {
        "null".into()
    } else if let Some(name) = value
        .dyn_ref::<Object>()
        .map(|o| String::from(o.constructor().name()))
    {
        format!("a {name}")
    } else {
        format!("a {}", value.js_typeof().as_string().unwrap_or_default())
    }
}

/// A tensor's elements as a new `Float32Array` (f32 and f16 tensors) or `Int32Array`.
pub fn typed_array(t: &HostTensor) -> JsValue {
    match &t.data {
        TensorData::F32(v) => Float32Array::from(v.as_slice()).into(),
        TensorData::I32(v) => Int32Array::from(v.as_slice()).into(),
        TensorData::F16(v) => {
            let wide: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
            Float32Array::from(wide.as_slice()).into()
        }
    }
}

/// `{ name: TypedArray, … }` in the given order.
pub(crate) fn tensors_object<'a>(
    tensors: impl Iterator<Item = (&'a str, &'a HostTensor)>,
) -> Result<Object, WebError> {
    let out = Object::new();
    for (name, t) in tensors {
        set(&out, name, &typed_array(t))?;
    }
    Ok(out)
}

/// `{ dtype, shape, data }`.
pub(crate) fn tensor_object(t: &HostTensor) -> Result<Object, WebError> {
    let out = Object::new();
    set(&out, "dtype", &t.data.dtype().name().into())?;
    set(&out, "shape", &shape_array(&t.shape))?;
    set(&out, "data", &typed_array(t))?;
    Ok(out)
}

/// `{ name, role, dtype, shape }` of a manifest slot.
pub fn tensor_info(slot: &TensorSlot) -> JsValue {
    let out = Object::new();
    let role = match slot.role {
        Role::Input => "input",
        Role::Output => "output",
        Role::Param => "param",
        Role::State => "state",
    };
    // Setting a property of a fresh plain object cannot throw.
    let fields: [(&str, JsValue); 4] = [
        ("name", slot.name.as_str().into()),
        ("role", role.into()),
        ("dtype", slot.ty.dtype.name().into()),
        ("shape", shape_array(&slot.ty.shape).into()),
    ];
    for (key, value) in fields {
        let _ = Reflect::set(&out, &key.into(), &value);
    }
    out.into()
}

fn shape_array(shape: &[usize]) -> Array {
    shape.iter().map(|&d| JsValue::from(d as f64)).collect()
}

fn get(object: &Object, key: &JsValue) -> Result<JsValue, WebError> {
    Reflect::get(object, key).map_err(|e| WebError::Js(js_message(&e)))
}

fn set(object: &Object, key: &str, value: &JsValue) -> Result<(), WebError> {
    Reflect::set(object, &key.into(), value)
        .map(drop)
        .map_err(|e| WebError::Js(js_message(&e)))
}
