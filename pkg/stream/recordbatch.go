package stream

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"time"

	"github.com/segmentio/kafka-go"
)

// A v2 record batch (Kafka's message format since 0.11), uncompressed:
//
//	baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 (2)
//	| crc uint32 (CRC-32C of attributes … end) | attributes int16 | lastOffsetDelta int32
//	| firstTimestamp int64 | maxTimestamp int64 | producerId int64 | producerEpoch int16
//	| baseSequence int32 | recordCount int32 | records
//
// and each record, its integers zigzag varints:
//
//	length | attributes int8 | timestampDelta | offsetDelta | keyLength | key
//	| valueLength | value | headerCount | (keyLength key valueLength value)…
//
// A null key or header value has length -1.

// append encodes one record at the end of b.
func (b *recordBatch) append(ts int64, key, value []byte, headers []kafka.Header) {
	if b.n == 0 {
		b.first, b.max = ts, ts
	}
	b.max = max(b.max, ts)
	delta := ts - b.first
	size := 1 + varintLen(delta) + varintLen(int64(b.n)) + bytesLen(key) + bytesLen(value) + varintLen(int64(len(headers)))
	for _, h := range headers {
		size += varintLen(int64(len(h.Key))) + len(h.Key) + bytesLen(h.Value)
	}
	buf := binary.AppendVarint(b.buf, int64(size))
	buf = append(buf, 0)
	buf = binary.AppendVarint(buf, delta)
	buf = binary.AppendVarint(buf, int64(b.n))
	buf = appendRecordBytes(buf, key)
	buf = appendRecordBytes(buf, value)
	buf = binary.AppendVarint(buf, int64(len(headers)))
	for _, h := range headers {
		buf = binary.AppendVarint(buf, int64(len(h.Key)))
		buf = append(buf, h.Key...)
		buf = appendRecordBytes(buf, h.Value)
	}
	b.buf = buf
	b.n++
}

func appendRecordBytes(buf, v []byte) []byte {
	if v == nil {
		return binary.AppendVarint(buf, -1)
	}
	return append(binary.AppendVarint(buf, int64(len(v))), v...)
}

func bytesLen(v []byte) int {
	if v == nil {
		return varintLen(-1)
	}
	return varintLen(int64(len(v))) + len(v)
}

// varintLen is the length of binary.AppendVarint(nil, v).
func varintLen(v int64) int {
	u := uint64(v<<1) ^ uint64(v>>63)
	n := 1
	for u >= 0x80 {
		u >>= 7
		n++
	}
	return n
}

// seal writes b's header; b must hold at least one record. A produce
// request carries a record set as its size (int32) and the batch, and
// RawProduce copies b.buf as is, so b.buf holds both.
func (b *recordBatch) seal() {
	be := binary.BigEndian
	be.PutUint32(b.buf[0:], uint32(len(b.buf)-4)) // the record set's size
	h := b.buf[4:recordBatchHeader]
	be.PutUint64(h[0:], 0)                     // baseOffset: the broker assigns
	be.PutUint32(h[8:], uint32(len(b.buf)-16)) // batchLength: from partitionLeaderEpoch on
	be.PutUint32(h[12:], 0xffffffff)           // partitionLeaderEpoch: none (a producer's)
	h[16] = 2                                  // magic
	be.PutUint16(h[21:], 0)                    // attributes: no compression, create time
	be.PutUint32(h[23:], uint32(b.n-1))        // lastOffsetDelta
	be.PutUint64(h[27:], uint64(b.first))      // firstTimestamp
	be.PutUint64(h[35:], uint64(b.max))        // maxTimestamp
	be.PutUint64(h[43:], 0xffffffffffffffff)   // producerId: not idempotent
	be.PutUint16(h[51:], 0xffff)               // producerEpoch
	be.PutUint32(h[53:], 0xffffffff)           // baseSequence
	be.PutUint32(h[57:], uint32(b.n))          // recordCount
	be.PutUint32(h[17:], crc32.Checksum(b.buf[4+21:], castagnoli))
}

// reset empties b for reuse, keeping its buffer.
func (b *recordBatch) reset() {
	clear(b.buf[:recordBatchHeader])
	b.buf, b.n, b.first, b.max = b.buf[:recordBatchHeader], 0, 0, 0
}

var errRecordBatch = errors.New("malformed record batch")

// messages decodes b's records back into messages of topic and partition
// (copies: b is reused), for OnFailed.
func (b *recordBatch) messages(topic string, partition int) ([]kafka.Message, error) {
	out := make([]kafka.Message, 0, b.n)
	rest := b.buf[recordBatchHeader:]
	next := func() (int64, bool) {
		v, k := binary.Varint(rest)
		if k <= 0 {
			return 0, false
		}
		rest = rest[k:]
		return v, true
	}
	bytesOf := func() ([]byte, bool) {
		l, ok := next()
		switch {
		case !ok || l < -1 || l > int64(len(rest)):
			return nil, false
		case l == -1:
			return nil, true
		}
		v := append([]byte{}, rest[:l]...)
		rest = rest[l:]
		return v, true
	}
	for i := range b.n {
		size, ok := next()
		if !ok || size < 1 || size > int64(len(rest)) {
			return out, fmt.Errorf("%w: record %d length", errRecordBatch, i)
		}
		rest = rest[1:] // attributes
		delta, ok1 := next()
		_, ok2 := next() // offsetDelta
		key, ok3 := bytesOf()
		value, ok4 := bytesOf()
		nh, ok5 := next()
		if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || nh < 0 || nh > int64(len(rest)) {
			return out, fmt.Errorf("%w: record %d", errRecordBatch, i)
		}
		m := kafka.Message{Topic: topic, Partition: partition, Key: key, Value: value, Time: time.UnixMilli(b.first + delta)}
		for range nh {
			k, okk := bytesOf()
			v, okv := bytesOf()
			if !okk || !okv || k == nil {
				return out, fmt.Errorf("%w: record %d header", errRecordBatch, i)
			}
			m.Headers = append(m.Headers, kafka.Header{Key: string(k), Value: v})
		}
		out = append(out, m)
	}
	return out, nil
}

// bytesReader is a bytes.Reader that a recordBatch holds by value, so
// handing it to RawProduce allocates nothing.
type bytesReader struct {
	b []byte
	i int
}

func (r *bytesReader) reset(b []byte) { r.b, r.i = b, 0 }

func (r *bytesReader) Read(p []byte) (int, error) {
	if r.i >= len(r.b) {
		return 0, io.EOF
	}
	n := copy(p, r.b[r.i:])
	r.i += n
	return n, nil
}

// WriteTo lets io.Copy write the batch in one call.
func (r *bytesReader) WriteTo(w io.Writer) (int64, error) {
	n, err := w.Write(r.b[r.i:])
	r.i += n
	return int64(n), err
}
