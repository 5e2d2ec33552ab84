#!/usr/bin/env python3
"""Writes the fuzz seed corpus from the recorded fixture streams (payload_b64 / frames_b64).

Run from the repository root: python3 fuzz/make_seeds.py
Layouts match the targets: decode_batch = one payload; decode_message = [n % 5, then n-1
one-byte-length frames, last frame = rest]; decode_apply = records [ctrl, len_hi, len_lo,
payload] with ctrl & 3 = source (the fixture's endpoint_index).
"""
import base64, glob, hashlib, json, os

ROOT = os.path.dirname(os.path.abspath(__file__))
out = {t: os.path.join(ROOT, "seeds", t) for t in ("decode_batch", "decode_message", "decode_apply")}
for d in out.values():
    os.makedirs(d, exist_ok=True)

def write(target, data):
    name = hashlib.sha1(data).hexdigest()
    with open(os.path.join(out[target], name), "wb") as f:
        f.write(data)

def frames_seed(frames):
    buf = bytearray([len(frames) % 5])
    for f in frames[:-1]:
        buf.append(min(len(f), 255))
        buf += f[:255]
    if frames:
        buf += frames[-1]
    return bytes(buf)

fixtures = os.path.join(ROOT, "..", "fixtures")
for path in sorted(glob.glob(os.path.join(fixtures, "**", "*.jsonl"), recursive=True)):
    stream = bytearray()
    for line in open(path):
        rec = json.loads(line)
        if "payload_b64" in rec:
            payload = base64.b64decode(rec["payload_b64"])
            seq = rec["seq"].to_bytes(8, "big")
            frames = [rec.get("topic", "").encode(), seq, payload]
            source = rec.get("endpoint_index", 0) & 3
        elif "frames_b64" in rec:
            frames = [base64.b64decode(f) for f in rec["frames_b64"]]
            payload = frames[-1] if frames else b""
            source = 0
            if rec.get("dir") == "request":
                continue
        else:
            continue
        if payload:
            write("decode_batch", payload)
        write("decode_message", frames_seed(frames))
        if len(payload) < 65536:
            stream += bytes([source, len(payload) >> 8, len(payload) & 0xFF]) + payload
    if stream:
        write("decode_apply", bytes(stream))
for t, d in out.items():
    print(t, len(os.listdir(d)), "seeds")
