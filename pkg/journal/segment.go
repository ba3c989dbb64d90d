package journal

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// A journal is a directory of segments: the active one takes appends, sealed
// ones wait for replay; the cap drops the oldest. What follows is their
// lifecycle (recovery at Open is in recover.go).

type journalSegment struct {
	id       uint64
	dir      string
	size     int64 // bytes written (valid records), magic included
	records  int64
	ackedOff int64 // every record before this offset is acknowledged
	prefix   int64 // records before ackedOff
	acked    int64 // records acknowledged (some may lie past ackedOff)
	sealed   bool  // no more appends; replayable
	busy     bool  // the drainer is publishing from it: the cap must not drop it
	dropped  bool  // removed by the cap
}

func (s *journalSegment) path() string {
	return filepath.Join(s.dir, fmt.Sprintf("%020d%s", s.id, segmentFileSuffix))
}

func (s *journalSegment) checkpointPath() string {
	return filepath.Join(s.dir, fmt.Sprintf("%020d%s", s.id, checkpointSuffix))
}

// activeSegment returns the segment being appended to, or nil. j.mu held.
func (j *Journal) activeSegment() *journalSegment {
	if j.active == nil || len(j.segs) == 0 {
		return nil
	}
	return j.segs[len(j.segs)-1]
}

// roomBytes is what the journal's filesystem lets it hold now: what it
// holds plus the free space less ReserveBytes (MaxInt64 where free space is
// not known). j.mu held.
func (j *Journal) roomBytes() int64 {
	free, err := j.free(j.cfg.Dir)
	if err != nil {
		return math.MaxInt64
	}
	return j.bytes + free - j.cfg.ReserveBytes
}

// makeRoom makes need more bytes fit on disk. Over MaxBytes it drops the
// oldest segments the drainer is not publishing from (ErrFull if that is
// not enough); over the filesystem's room (roomBytes) it drops nothing and
// returns errNoRoom: the records go to the memory buffer. j.mu held.
func (j *Journal) makeRoom(need int64) error {
	for j.bytes+need > j.cfg.MaxBytes {
		var victim *journalSegment
		for _, s := range j.segs {
			if !s.busy {
				victim = s
				break
			}
		}
		if victim == nil {
			return ErrFull
		}
		if !victim.sealed {
			j.sealActive()
		}
		j.dropSegment(victim)
	}
	if room := j.roomBytes(); j.bytes+need > room {
		return fmt.Errorf("%w: %d bytes free after the %d-byte reserve, %d needed", errNoRoom, max(room-j.bytes, 0), j.cfg.ReserveBytes, need)
	}
	return nil
}

// dropSegment deletes seg because of the cap, counting what it still held.
// j.mu held.
func (j *Journal) dropSegment(seg *journalSegment) {
	lostRecords := seg.records - seg.acked
	j.segs = slices.DeleteFunc(j.segs, func(s *journalSegment) bool { return s == seg })
	seg.dropped = true
	j.bytes -= seg.size
	j.pending -= lostRecords
	j.drop(journalDropCap, lostRecords, false)
	j.removeSegmentFiles(seg)
	j.logError("journal over its size cap: oldest segment dropped", "segment", seg.id,
		"messages_lost", lostRecords, "bytes", seg.size, "max_bytes", j.cfg.MaxBytes)
}

func (j *Journal) removeSegmentFiles(seg *journalSegment) {
	if err := os.Remove(seg.path()); err != nil && !errors.Is(err, os.ErrNotExist) {
		j.log.Error("remove journal segment", "segment", seg.id, "err", err)
	}
	if err := os.Remove(seg.checkpointPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		j.log.Warn("remove journal checkpoint", "segment", seg.id, "err", err)
	}
}

// startSegment creates the next segment and makes it active. j.mu held.
func (j *Journal) startSegment() (*journalSegment, error) {
	seg := &journalSegment{id: j.nextID, dir: j.cfg.Dir, size: int64(len(segmentMagic)), ackedOff: int64(len(segmentMagic))}
	f, err := os.OpenFile(seg.path(), os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("create segment: %w", err)
	}
	j.nextID++
	if _, err := f.Write([]byte(segmentMagic)); err != nil {
		_ = f.Close()
		_ = os.Remove(seg.path())
		return nil, fmt.Errorf("write segment header: %w", err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		_ = os.Remove(seg.path())
		return nil, fmt.Errorf("sync segment: %w", err)
	}
	if err := syncDir(j.cfg.Dir); err != nil {
		j.log.Warn("sync journal dir", "err", err)
	}
	j.active = f
	j.segs = append(j.segs, seg)
	j.bytes += seg.size
	return seg, nil
}

// sealActive fsyncs and closes the active segment; it becomes replayable.
// j.mu held.
func (j *Journal) sealActive() {
	seg := j.activeSegment()
	if seg == nil {
		return
	}
	j.syncActive()
	if err := j.active.Close(); err != nil {
		j.log.Warn("close journal segment", "segment", seg.id, "err", err)
	}
	j.active = nil
	seg.sealed = true
}

// syncActive fsyncs the active segment if it has unsynced writes. j.mu held.
func (j *Journal) syncActive() {
	if j.active == nil || !j.dirty {
		return
	}
	start := time.Now()
	err := j.active.Sync()
	j.fsyncSeconds.Observe(time.Since(start).Seconds())
	if err != nil {
		// Linux may drop the dirty pages after a failed fsync: the records
		// are still readable by this process but may not survive a crash.
		j.fsyncErrors.Inc()
		j.log.Error("journal fsync failed", "err", err)
		return
	}
	j.dirty = false
}

// Sync fsyncs the active segment now (whatever the policy).
func (j *Journal) Sync() {
	j.mu.Lock()
	j.syncActive()
	j.mu.Unlock()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}
