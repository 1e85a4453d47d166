#!/usr/bin/env python3
"""round_timeline.py DIR CASE [TENSOR]: where a psbench round's time goes, from its --trace files.

    build/bench/psbench --quick --only ops --shards 1 --workers 1 --transports shm \\
        --sizes 1M --trace /tmp/tr
    bench/round_timeline.py /tmp/tr c1-1x1-shm

CASE names the files of one cluster: DIR/CASE-client0.json (libps's PS_TRACE of the first
client) and DIR/CASE-shard*.json (psd --trace of every shard). psbench's rounds are the
client's push ops of one tensor (TENSOR, its id; by default the one with the most chunks,
the first of those: with several --sizes of one chunk each, name the one wanted) each
followed within 100 us by a pull op of it (the round's pull of the next version; its lone
pushes and pulls are left out). For each round, from the push's hand-over to the comm thread
(t = 0), it takes the comm thread's first take of a chunk of the push (its "took" instant)
and the shards' events of that tensor inside the round: the first push header (or eager /
direct push) of the round's step and the last push's data landed on a shard (another
worker's may come before t = 0), the apply jobs (their summed time and the last
one's end), the answers to the pulls of the version the round makes (the last: a reply sent
over UCX to the end of its transfer, a direct pull's place in the store when given), and the
client's last acknowledgement and last pull chunk landed; and prints their medians over the
rounds after the first fifth (the warm-up), in microseconds, with the round's median. The
apply share is the applies' summed time over the round: what psd's loop cannot overlap with
the transfers. Timestamps are CLOCK_MONOTONIC: the processes of one host only. Not a test:
nothing here asserts a figure.
"""
import bisect
import glob
import json
import math
import os
import statistics
import sys


def load(path):
    """A trace's events; a trace whose writer was killed (no closing ']') is read as far as
    its last whole line."""
    with open(path) as f:
        lines = f.read().splitlines()
    events = []
    for line in lines[1:]:
        line = line.rstrip().rstrip(',')
        if not line or line == ']':
            continue
        try:
            events.append(json.loads(line))
        except ValueError:
            break  # a half-written last line
    return events


def main(argv):
    if len(argv) not in (3, 4):
        sys.stderr.write(__doc__.split('\n\n')[0] + '\n')
        return 2
    d, case = argv[1], argv[2]
    cpath = os.path.join(d, case + '-client0.json')
    spaths = sorted(glob.glob(os.path.join(d, case + '-shard*.json')))
    if not os.path.exists(cpath) or not spaths:
        sys.stderr.write('round_timeline: no %s or no %s-shard*.json in %s\n'
                         % (os.path.basename(cpath), case, d))
        return 1
    cl = load(cpath)
    ends = {e['id2']['local']: e['ts'] for e in cl if e.get('cat') == 'op' and e['ph'] == 'e'}
    # The tensor of the rounds (TENSOR, else the one whose ops have the most chunks, the first
    # declared of those: psbench declares a round's tensor before round_many's small ones).
    ops = [e for e in cl if e.get('cat') == 'op' and e['ph'] == 'b' and
           e['name'].split(' ')[0] in ('push', 'pull')]
    if not ops:
        sys.stderr.write('round_timeline: no push or pull in %s\n' % cpath)
        return 1
    chunks = {}
    for e in ops:
        t = e['name'].split(' ')[-1]
        chunks[t] = max(chunks.get(t, 0), e.get('args', {}).get('chunks', 0))
    if len(argv) == 4:
        big = argv[3]
        if big not in chunks:
            sys.stderr.write('round_timeline: no push or pull of tensor %s in %s (there: %s)\n'
                             % (big, cpath, ' '.join(sorted(chunks, key=int))))
            return 1
    else:
        big = min(chunks, key=lambda t: (-chunks[t], int(t)))
    pushes = sorted((e['ts'], e['id2']['local'], e['args']['step']) for e in ops
                    if e['name'] == 'push ' + big)
    pulls = sorted((e['ts'], e['id2']['local']) for e in ops if e['name'] == 'pull ' + big)
    mine = (big + '/')
    took = sorted(e['ts'] for e in cl if e['name'].startswith('took ' + mine) and
                  e.get('args', {}).get('op') == 'push')
    acked = sorted(e['ts'] for e in cl if e['name'].startswith('acked ' + mine))
    landed = sorted(e['ts'] for e in cl if e['name'].startswith('landed ' + mine))
    # The shards' events of that tensor: pushes (header, landed, step), pull answers (when,
    # version) and apply jobs (begin, end) whose first chunk is of it; each async span from
    # its 'b' (with its args) to its 'e' (ids are per file).
    pushed, answered, applies = [], [], []
    for sp in spaths:
        begin = {}
        for e in load(sp):
            cat, ph, name = e.get('cat'), e.get('ph'), e.get('name', '')
            if name == 'apply' and ph == 'X':
                if e.get('args', {}).get('first', '').startswith(mine):
                    applies.append((e['ts'], e['ts'] + e['dur']))
            elif cat in ('push', 'pull') and ph == 'b':
                if name.split(' ')[-1].startswith(mine):
                    begin[e['id2']['local']] = e
            elif cat in ('push', 'pull') and ph == 'e':
                b = begin.pop(e['id2']['local'], None)
                if b is None:
                    continue
                if cat == 'push':
                    pushed.append((e['ts'], b['ts'], b['args'].get('step')))
                else:
                    answered.append((e['ts'], b['args'].get('version')))
            elif ph == 'i' and name.startswith('push ' + mine):
                # an eager or direct push: an instant
                pushed.append((e['ts'], e['ts'], e.get('args', {}).get('step')))
    for ts in (pushed, answered, applies):
        ts.sort()
    rows = []
    j = 0
    for t0, pid, step in pushes:
        while j < len(pulls) and pulls[j][0] < t0:
            j += 1
        if j == len(pulls) or pulls[j][0] - t0 > 100 or pid not in ends or \
                pulls[j][1] not in ends:
            continue
        t1 = max(ends[pid], ends[pulls[j][1]])

        def inside(ts):  # sorted by their first field, the time
            return ts[bisect.bisect_left(ts, (t0,)):bisect.bisect_right(ts, (t1, float('inf')))]

        # This round's pushes (another worker's next step may land inside it) and answers
        # to the pulls of the version it makes.
        pu = [(ld - t0, hd - t0) for ld, hd, st in inside(pushed) if st == step]
        rp = [t - t0 for t, v in inside(answered) if v == step + 1]
        ap = [(b - t0, e - t0) for b, e in inside(applies)]
        ak = [t - t0 for t in acked[bisect.bisect_left(acked, t0):bisect.bisect_right(acked, t1)]]
        tk = [t - t0 for t in took[bisect.bisect_left(took, t0):bisect.bisect_right(took, t1)]]
        ld = [t - t0 for t in landed[bisect.bisect_left(landed, t0):
                                     bisect.bisect_right(landed, t1)]]
        if not (pu and ap and rp and ld):
            continue
        rows.append({
            # libps before session 52 wrote no "took" instants
            'comm thread took the push': min(tk) if tk else float('nan'),
            'first push at psd': min(h for _, h in pu),
            'last push data landed': max(t for t, _ in pu),
            'applies (summed)': sum(e - b for b, e in ap),
            'last apply ended': max(e for _, e in ap),
            'last ack at the client': max(ak) if ak else float('nan'),
            'last pull answered': max(rp),
            'last pull chunk landed': max(ld),
            'round': t1 - t0,
            'apply jobs': len(ap),
        })
    rows = rows[len(rows) // 5:]
    if not rows:
        sys.stderr.write('round_timeline: no round of %s (a push then a pull within 100 us, '
                         'with psd events inside it) in %s\n' % (case, d))
        return 1
    print('%s, tensor %s (%d chunks): %d rounds (after the first fifth), medians, us from the '
          'push\'s hand-over' % (case, big, chunks[big], len(rows)))
    for k in rows[0]:
        vs = [r[k] for r in rows if not math.isnan(r[k])]  # no ack: pushes acked later
        if not vs:
            print('  %-28s %9s' % (k, '-'))
            continue
        v = statistics.median(vs)
        print('  %-28s %9.1f' % (k, v) if k != 'apply jobs' else '  %-28s %9d' % (k, v))
    share = statistics.median(r['applies (summed)'] / r['round'] for r in rows)
    print('  %-28s %9.2f' % ('apply share of the round', share))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
