import pytest
import torch

from rcllm.kvstore.base import ChunkKV, chunk_key
from rcllm.kvstore.codec import InvalidEntry, KeyCheck, decode, encode, encode_checked
from rcllm.kvstore.int8 import dequantize, int8_fidelity, quantize_per_channel

from kv_helpers import FP, make_entry, same


def test_round_trip_raw_is_exact(check):
    key, kv = make_entry(0)
    assert same(decode(encode_checked(key, kv, "raw", check), key, check), kv)


def test_bit_flip_is_detected(check):
    key, kv = make_entry(1)
    data = bytearray(encode_checked(key, kv, "raw", check))
    data[-5] ^= 0x01
    with pytest.raises(InvalidEntry, match="checksum"):
        decode(bytes(data), key, check)


def test_truncated_and_foreign_bytes_are_invalid(check):
    key, kv = make_entry(2)
    data = encode_checked(key, kv, "raw", check)
    for bad in (data[:len(data) // 2], b"", b"not a safetensors file at all"):
        with pytest.raises(InvalidEntry):
            decode(bad, key, check)


def test_wrong_key_fingerprint_or_token_ids_are_invalid(check):
    key, kv = make_entry(3)
    other_key, _ = make_entry(4)
    good = encode_checked(key, kv, "raw", check)
    with pytest.raises(InvalidEntry, match="another key"):
        decode(good, other_key, check)
    # intact bytes, but computed by another model: the reader's fingerprint differs
    with pytest.raises(InvalidEntry, match="fingerprint"):
        decode(good, key, KeyCheck("model-fp-2"))
    # intact bytes whose token ids do not hash to the key they are stored under
    liar = ChunkKV(kv.token_ids[:-1] + (kv.token_ids[-1] + 1,), kv.k, kv.v)
    with pytest.raises(InvalidEntry, match="token ids"):
        decode(encode(key, liar, kind="item", fingerprint=FP), key, check)


def test_put_with_key_for_another_model_is_refused(check):
    _, kv = make_entry(5)
    foreign = chunk_key("model-fp-2", "item", kv.token_ids)
    assert encode_checked(foreign, kv, "raw", check) is None


def test_int8_per_channel_error_bound_and_bytes():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 2, 64, 16, generator=g)
    x[:, :, :, 3] *= 50  # an outlier channel must not hurt the others
    q, scale = quantize_per_channel(x)
    assert q.dtype == torch.int8 and scale.shape == (4, 2, 1, 16)
    err = (dequantize(q, scale, torch.float32) - x).abs()
    assert torch.all(err <= scale / 2 + 1e-6)
    assert err[..., 0].max() < 0.1 * err[..., 3].max()
    kv = ChunkKV(tuple(range(64)), x, x.clone())
    fid = int8_fidelity(kv)
    assert fid.int8_bytes < 0.3 * fid.raw_bytes and fid.saved_fraction > 0.7
    assert 0 < fid.k_rel_err < 0.02 and fid.k_max_abs_err > 0


def test_int8_encoding_round_trip_is_close(check):
    key, kv = make_entry(6, num_tokens=32)
    raw = encode_checked(key, kv, "raw", check)
    small = encode_checked(key, kv, "int8", check)
    assert len(small) < 0.5 * len(raw)
    back = decode(small, key, check)
    assert back.token_ids == kv.token_ids and back.k.dtype == kv.k.dtype
    assert torch.allclose(back.k, kv.k, atol=0.05) and not torch.equal(back.k, kv.k)


def test_zero_channels_stay_exact():
    q, s = quantize_per_channel(torch.zeros(1, 1, 4, 2))
    assert torch.equal(dequantize(q, s, torch.float32), torch.zeros(1, 1, 4, 2))
