"""Plan.stream: tensors in the caller's order, computed ahead within the prefetch window, errors at their turn."""
import threading
import time

import numpy as np
import pytest
from safetensors.numpy import save_file

import lazyweights as lw
from lazyweights.run import stream as stream_mod

RNG = np.random.default_rng(3)


@pytest.fixture
def layered(tmp_path):
    tensors = {f"model.layers.{i}.{w}": RNG.standard_normal((64, 32)).astype(np.float32)
               for i in range(6) for w in ("a", "b")}
    tensors["model.norm.weight"] = RNG.standard_normal(32).astype(np.float32)
    save_file(tensors, str(tmp_path / "m.safetensors"))
    w = lw.load_weights(tmp_path / "m.safetensors")
    return lw.plan({n: a.data().astype(lw.DType.float16) for n, a in w.items()}), tensors


def test_values_and_order_equal_materialize(layered):
    p, tensors = layered
    got = list(p.stream("layers", prefetch="8KB"))
    names = [n for n, _ in got]
    assert names[0] == "model.norm.weight"
    assert names[1:] == [f"model.layers.{i}.{w}" for i in range(6) for w in ("a", "b")]
    for name, arr in got:
        assert np.array_equal(arr, tensors[name].astype(np.float16)), name
    explicit = [n for n, _ in p.stream(["model.layers.3.b", ["model.layers.0.a", "model.layers.5.a"]])]
    assert explicit == ["model.layers.3.b", "model.layers.0.a", "model.layers.5.a"]


def test_prefetch_window_bounds_work_ahead(layered, monkeypatch):
    p, _ = layered
    group_bytes = 2 * 64 * 32 * 2  # one layer's two f16 tensors
    computed = []
    real = stream_mod.execute

    def spy(outputs, sink, **kw):
        real(outputs, sink, **kw)
        computed.append(sorted(outputs))

    monkeypatch.setattr(stream_mod, "execute", spy)
    gen = p.stream("layers", prefetch=2 * group_bytes)
    next(gen)  # the norm; the producer may now run ahead
    time.sleep(0.5)
    # taken: the norm group; ahead: at most 2 layers' worth of bytes beyond the group being consumed
    assert len(computed) <= 4, computed
    rest = list(gen)
    assert len(rest) == 12 and len(computed) == 7


def test_error_arrives_at_its_turn_and_names_the_tensor(layered, monkeypatch):
    p, _ = layered
    import lazyweights.run.sinks as sinks

    real = sinks.MemorySink.run_block

    def failing(self, task):
        if task.step.outputs[0] == "model.layers.2.a":
            raise RuntimeError("disk on fire")
        return real(self, task)

    monkeypatch.setattr(sinks.MemorySink, "run_block", failing)
    seen = []
    with pytest.raises(lw.ExecutionError, match=r"model\.layers\.2\.a.*disk on fire"):
        for name, _ in p.stream("layers"):
            seen.append(name)
    assert seen[-1] == "model.layers.1.b"  # everything before the failing layer was delivered


def test_closing_early_stops_the_producer(layered):
    p, _ = layered
    before = threading.active_count()
    for i, _ in enumerate(p.stream("layers", prefetch="1MB")):
        if i == 2:
            break
    time.sleep(0.2)
    assert threading.active_count() <= before
    assert not [t for t in threading.enumerate() if t.name == "lazyweights-stream"]


def test_bad_order_is_refused(layered):
    p, _ = layered
    with pytest.raises(lw.LazyWeightsError, match="model.layers.0.a"):
        list(p.stream(["model.layers.0.aa"]))
    with pytest.raises(lw.LazyWeightsError, match="twice"):
        list(p.stream(["model.norm.weight", "model.norm.weight"]))
