//! `import petrel_producer`: the Rust producer for Python. `send` encodes
//! the record while holding the GIL (it is a memory copy); only when it
//! has to wait for room (`max_block_ms`) is the GIL released, as in
//! `flush` and `close`.

use std::sync::Arc;
use std::time::Duration;

use ::petrel_producer::{Compression, Config, Outcome, Producer as Inner, Record, SendError};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

create_exception!(
    petrel_producer,
    QueueFull,
    PyException,
    "The producer's queue is full (total_size_in_bytes) and max_block_ms passed."
);
create_exception!(
    petrel_producer,
    ProducerClosed,
    PyException,
    "The producer is closed."
);

fn to_py_err(e: SendError) -> PyErr {
    match e {
        SendError::Full => QueueFull::new_err(e.to_string()),
        SendError::Closed => ProducerClosed::new_err(e.to_string()),
        SendError::TooLarge => PyValueError::new_err(e.to_string()),
    }
}

fn outcome_dict<'py>(py: Python<'py>, o: &Outcome) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    match o {
        Outcome::Delivered { attempts } => {
            d.set_item("status", "delivered")?;
            d.set_item("attempts", attempts)?;
        }
        Outcome::Spooled { attempts } => {
            d.set_item("status", "spooled")?;
            d.set_item("attempts", attempts)?;
        }
        Outcome::Failed { reason, attempts } => {
            d.set_item("status", "failed")?;
            d.set_item("attempts", attempts)?;
            d.set_item("reason", reason)?;
        }
    }
    Ok(d)
}

/// A producer sending to Petrel's HTTP source. Thread-safe.
#[pyclass(frozen, module = "petrel_producer")]
struct Producer {
    inner: Arc<Inner>,
}

/// The record's strings, kept alive while their `&str` are used.
fn strings<'py>(fields: &Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyString>>> {
    let as_str = |o: Bound<'py, PyAny>| -> PyResult<Bound<'py, PyString>> {
        match o.downcast_into::<PyString>() {
            Ok(s) => Ok(s),
            Err(e) => e.into_inner().str(),
        }
    };
    let mut keep = Vec::new();
    if let Ok(d) = fields.downcast::<PyDict>() {
        keep.reserve(d.len() * 2);
        for (k, v) in d.iter() {
            keep.push(as_str(k)?);
            keep.push(as_str(v)?);
        }
    } else {
        for item in fields.try_iter()? {
            let (k, v): (Bound<'py, PyAny>, Bound<'py, PyAny>) = item?.extract()?;
            keep.push(as_str(k)?);
            keep.push(as_str(v)?);
        }
    }
    Ok(keep)
}

impl Producer {
    fn send_inner(
        &self,
        py: Python<'_>,
        fields: &Bound<'_, PyAny>,
        time_ns: Option<u64>,
        stream: Option<&str>,
        callback: Option<PyObject>,
    ) -> PyResult<()> {
        let keep = strings(fields)?;
        let strs = keep
            .iter()
            .map(|s| s.to_str())
            .collect::<PyResult<Vec<&str>>>()?;
        let pairs: Vec<(&str, &str)> = strs.chunks_exact(2).map(|c| (c[0], c[1])).collect();
        let rec = Record {
            fields: &pairs,
            time_ns,
            stream,
        };
        let inner = &self.inner;
        match callback {
            None => match inner.try_send(&rec) {
                Ok(()) => Ok(()),
                Err(SendError::Full) => py.allow_threads(|| inner.send(&rec)).map_err(to_py_err),
                Err(e) => Err(to_py_err(e)),
            },
            Some(cb) => {
                let call = Box::new(move |o: &Outcome| {
                    Python::with_gil(|py| {
                        let r = outcome_dict(py, o).and_then(|d| cb.call1(py, (d,)));
                        if let Err(e) = r {
                            e.print(py);
                        }
                    })
                });
                match inner.try_send_with_callback(&rec, call) {
                    Ok(()) => Ok(()),
                    Err((SendError::Full, call)) => py
                        .allow_threads(|| inner.send_with_callback(&rec, call))
                        .map_err(to_py_err),
                    Err((e, _)) => Err(to_py_err(e)),
                }
            }
        }
    }
}

#[pymethods]
impl Producer {
    /// Producer(endpoint, *, total_size_in_bytes=100 MiB, max_block_ms=60000,
    /// batch_size_threshold_in_bytes=1 MiB, batch_count_threshold=40960,
    /// linger_ms=2000, io_thread_count=2, retries=10, base_retry_backoff_ms=100,
    /// max_retry_backoff_ms=50000, compression="lz4", request_timeout_ms=30000,
    /// spool_dir=None, spool_max_bytes=1 GiB, bearer_token=None)
    #[new]
    #[pyo3(signature = (endpoint, *, total_size_in_bytes=None, max_block_ms=None,
        batch_size_threshold_in_bytes=None, batch_count_threshold=None, linger_ms=None,
        io_thread_count=None, retries=None, base_retry_backoff_ms=None,
        max_retry_backoff_ms=None, compression=None, request_timeout_ms=None,
        spool_dir=None, spool_max_bytes=None, bearer_token=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        endpoint: String,
        total_size_in_bytes: Option<usize>,
        max_block_ms: Option<u64>,
        batch_size_threshold_in_bytes: Option<usize>,
        batch_count_threshold: Option<usize>,
        linger_ms: Option<u64>,
        io_thread_count: Option<usize>,
        retries: Option<u32>,
        base_retry_backoff_ms: Option<u64>,
        max_retry_backoff_ms: Option<u64>,
        compression: Option<&str>,
        request_timeout_ms: Option<u64>,
        spool_dir: Option<std::path::PathBuf>,
        spool_max_bytes: Option<u64>,
        bearer_token: Option<String>,
    ) -> PyResult<Self> {
        let mut c = Config::new(endpoint);
        macro_rules! set {
            ($($f:ident),*) => { $(if let Some(v) = $f { c.$f = v; })* };
        }
        set!(
            total_size_in_bytes,
            max_block_ms,
            batch_size_threshold_in_bytes,
            batch_count_threshold,
            linger_ms,
            io_thread_count,
            retries,
            base_retry_backoff_ms,
            max_retry_backoff_ms,
            request_timeout_ms,
            spool_max_bytes
        );
        if let Some(comp) = compression {
            c.compression = Compression::parse(comp).map_err(PyValueError::new_err)?;
        }
        c.spool_dir = spool_dir;
        c.bearer_token = bearer_token;
        let inner = Inner::new(c).map_err(PyValueError::new_err)?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// send(fields, time_ns=None, stream=None): queue a record (`fields` a
    /// dict or (key, value) pairs; non-string values are str()-ed). Raises
    /// QueueFull when there was no room within max_block_ms, ProducerClosed
    /// after close().
    #[pyo3(signature = (fields, time_ns=None, stream=None))]
    fn send(
        &self,
        py: Python<'_>,
        fields: &Bound<'_, PyAny>,
        time_ns: Option<u64>,
        stream: Option<&str>,
    ) -> PyResult<()> {
        self.send_inner(py, fields, time_ns, stream, None)
    }

    /// send_with_callback(fields, callback, time_ns=None, stream=None):
    /// like send; callback(outcome) is called once from an IO thread with
    /// {"status": "delivered"|"spooled"|"failed", "attempts": n, "reason": ...}.
    #[pyo3(signature = (fields, callback, time_ns=None, stream=None))]
    fn send_with_callback(
        &self,
        py: Python<'_>,
        fields: &Bound<'_, PyAny>,
        callback: PyObject,
        time_ns: Option<u64>,
        stream: Option<&str>,
    ) -> PyResult<()> {
        self.send_inner(py, fields, time_ns, stream, Some(callback))
    }

    /// flush(timeout=60.0) -> bool: send every batch now and wait until
    /// each is delivered, failed or spooled.
    #[pyo3(signature = (timeout=60.0))]
    fn flush(&self, py: Python<'_>, timeout: f64) -> bool {
        let t = Duration::from_secs_f64(timeout.max(0.0));
        py.allow_threads(|| self.inner.flush(t))
    }

    /// close(timeout=60.0) -> dict: deliver what is queued within timeout;
    /// returns undelivered_records, undelivered_bytes, spooled_records.
    #[pyo3(signature = (timeout=60.0))]
    fn close<'py>(&self, py: Python<'py>, timeout: f64) -> PyResult<Bound<'py, PyDict>> {
        let t = Duration::from_secs_f64(timeout.max(0.0));
        let r = py.allow_threads(|| self.inner.close(t));
        let d = PyDict::new(py);
        d.set_item("undelivered_records", r.undelivered_records)?;
        d.set_item("undelivered_bytes", r.undelivered_bytes)?;
        d.set_item("spooled_records", r.spooled_records)?;
        Ok(d)
    }

    /// counters() -> dict: sent, failed, rejected_full, retried,
    /// queued_bytes, spooled, sent_from_spool.
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.inner.counters();
        let d = PyDict::new(py);
        d.set_item("sent", c.sent)?;
        d.set_item("failed", c.failed)?;
        d.set_item("rejected_full", c.rejected_full)?;
        d.set_item("retried", c.retried)?;
        d.set_item("queued_bytes", c.queued_bytes)?;
        d.set_item("spooled", c.spooled)?;
        d.set_item("sent_from_spool", c.sent_from_spool)?;
        Ok(d)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) {
        let inner = &self.inner;
        py.allow_threads(|| inner.close(Duration::from_secs(60)));
    }
}

impl Drop for Producer {
    /// A producer collected without `close()`: close it (5 s) without the
    /// GIL, which callbacks run by the IO threads being joined need.
    fn drop(&mut self) {
        let inner = &self.inner;
        Python::with_gil(|py| {
            py.allow_threads(|| inner.close(Duration::from_secs(5)));
        });
    }
}

#[pymodule]
fn petrel_producer(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Producer>()?;
    m.add("QueueFull", m.py().get_type::<QueueFull>())?;
    m.add("ProducerClosed", m.py().get_type::<ProducerClosed>())?;
    Ok(())
}
