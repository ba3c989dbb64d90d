package journal

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// recover scans the directory's segments; see Open.
func (j *Journal) recover() error {
	entries, err := os.ReadDir(j.cfg.Dir)
	if err != nil {
		return fmt.Errorf("list journal dir: %w", err)
	}
	var ids []uint64
	checkpoints := map[uint64]bool{}
	for _, e := range entries {
		name := e.Name()
		base, suffix, ok := strings.Cut(name, ".")
		if !ok || e.IsDir() {
			continue
		}
		id, err := strconv.ParseUint(base, 10, 64)
		if err != nil || len(base) != 20 {
			continue
		}
		switch "." + suffix {
		case segmentFileSuffix:
			ids = append(ids, id)
		case checkpointSuffix:
			checkpoints[id] = true
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		delete(checkpoints, id)
		j.nextID = id + 1
		seg := &journalSegment{id: id, dir: j.cfg.Dir, sealed: true}
		keep, err := j.recoverSegment(seg)
		if err != nil {
			return err
		}
		if keep {
			j.segs = append(j.segs, seg)
			j.bytes += seg.size
			j.pending += seg.records - seg.acked
		}
	}
	for id := range checkpoints { // a segment deleted before its checkpoint
		_ = os.Remove((&journalSegment{id: id, dir: j.cfg.Dir}).checkpointPath())
	}
	return nil
}

// recoverSegment scans one segment, truncates a torn tail, restores its
// checkpoint, and deletes it when nothing in it is left to replay.
func (j *Journal) recoverSegment(seg *journalSegment) (keep bool, err error) {
	f, err := os.OpenFile(seg.path(), os.O_RDWR, 0)
	if err != nil {
		return false, fmt.Errorf("open segment: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return false, fmt.Errorf("stat segment: %w", err)
	}
	ckOff, ckRecords, ckOK := int64(0), int64(0), false
	if b, err := os.ReadFile(seg.checkpointPath()); err == nil {
		ckOff, ckRecords, ckOK = decodeCheckpoint(b)
		if !ckOK {
			j.log.Warn("journal checkpoint unreadable; replaying the segment from its start (consumers dedupe by ce_id)", "segment", seg.id)
		}
	}
	seg.ackedOff = int64(len(segmentMagic))
	records, valid, torn, err := scanSegment(f, func(end int64) {
		if ckOK && end == ckOff {
			seg.ackedOff = ckOff
		}
	})
	if err != nil {
		return false, fmt.Errorf("segment %d: %w", seg.id, err)
	}
	if seg.ackedOff == ckOff && ckOK {
		seg.prefix, seg.acked = ckRecords, ckRecords
	} else if ckOK {
		j.log.Warn("journal checkpoint not on a record boundary; replaying the segment from its start", "segment", seg.id, "offset", ckOff)
	}
	if torn {
		cut := st.Size() - valid
		j.truncatedBytes.Add(float64(cut))
		if valid < int64(len(segmentMagic)) {
			j.log.Warn("journal segment torn before its header; removing it", "segment", seg.id, "bytes", st.Size())
			j.removeSegmentFiles(seg)
			return false, nil
		}
		j.log.Warn("journal segment has a torn or corrupt tail; truncating", "segment", seg.id, "valid_bytes", valid, "cut_bytes", cut, "records", records)
		if err := f.Truncate(valid); err != nil {
			return false, fmt.Errorf("truncate segment %d: %w", seg.id, err)
		}
		if err := f.Sync(); err != nil {
			return false, fmt.Errorf("sync segment %d: %w", seg.id, err)
		}
	}
	seg.size, seg.records = valid, records
	if seg.acked > seg.records {
		seg.prefix, seg.acked = seg.records, seg.records
	}
	if seg.acked >= seg.records {
		j.removeSegmentFiles(seg)
		return false, nil
	}
	return true, nil
}
