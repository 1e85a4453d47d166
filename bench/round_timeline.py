#!/usr/bin/env python3
"""round_timeline.py DIR CASE: where a psbench round's time goes, from its --trace files.

    build/bench/psbench --quick --only ops --shards 1 --workers 1 --transports shm \\
        --sizes 1M --trace /tmp/tr
    bench/round_timeline.py /tmp/tr c1-1x1-shm

CASE names the files of one cluster: DIR/CASE-client0.json (libps's PS_TRACE of the first
client) and DIR/CASE-shard*.json (psd --trace of every shard). psbench's rounds are the
client's push ops of the tensor with the most chunks each followed within 100 us by a pull
op of it (the round's pull of the next version; its lone pushes and pulls are left out). For each round, from the push's hand-over
to the comm thread (t = 0), it takes the shards' events inside the round: the first push
header (or eager / direct push) and the last push's data landed on a shard, the apply jobs
(their summed time and the last one's end), the pulls' answers (the last: a reply sent over
UCX to the end of its transfer, a direct pull's place in the store when given), and the client's last acknowledgement and
last pull chunk landed; and prints their medians over the rounds after the first fifth (the
warm-up), in microseconds, with the round's median. The apply share is the applies' summed
time over the round: what psd's loop cannot overlap with the transfers. Not a test: nothing
here asserts a figure.
"""
import bisect
import glob
import json
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
    if len(argv) != 3:
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
    # The tensor of the rounds: the one whose ops have the most chunks (psbench's other
    # rounds are of many small tensors).
    ops = [e for e in cl if e.get('cat') == 'op' and e['ph'] == 'b' and
           e['name'].split(' ')[0] in ('push', 'pull')]
    if not ops:
        sys.stderr.write('round_timeline: no push or pull in %s\n' % cpath)
        return 1
    big = max(ops, key=lambda e: e.get('args', {}).get('chunks', 0))['name'].split(' ')[-1]
    pushes = sorted((e['ts'], e['id2']['local']) for e in ops if e['name'] == 'push ' + big)
    pulls = sorted((e['ts'], e['id2']['local']) for e in ops if e['name'] == 'pull ' + big)
    acked = sorted(e['ts'] for e in cl if e['name'].startswith('acked'))
    landed = sorted(e['ts'] for e in cl if e['name'].startswith('landed'))
    # The shards' spans: each async one from its 'b' to its 'e' (ids are per file).
    hdr, data, applies, replies = [], [], [], []
    for sp in spaths:
        begin = {}
        for e in load(sp):
            cat, ph = e.get('cat'), e.get('ph')
            if e.get('name') == 'apply' and ph == 'X':
                applies.append((e['ts'], e['ts'] + e['dur']))
            elif cat in ('push', 'pull') and ph == 'b':
                begin[e['id2']['local']] = e['ts']
            elif cat in ('push', 'pull') and ph == 'e':
                if cat == 'push':
                    hdr.append(begin.get(e['id2']['local'], e['ts']))
                    data.append(e['ts'])
                else:
                    replies.append(e['ts'])
            elif ph == 'i' and e.get('name', '').startswith('push '):
                # an eager or direct push: an instant
                hdr.append(e['ts'])
                data.append(e['ts'])
    for ts in (hdr, data, applies, replies):
        ts.sort()
    rows = []
    j = 0
    for t0, pid in pushes:
        while j < len(pulls) and pulls[j][0] < t0:
            j += 1
        if j == len(pulls) or pulls[j][0] - t0 > 100 or pid not in ends or \
                pulls[j][1] not in ends:
            continue
        t1 = max(ends[pid], ends[pulls[j][1]])

        def inside(ts):  # ts sorted
            return [t - t0 for t in ts[bisect.bisect_left(ts, t0):bisect.bisect_right(ts, t1)]]

        ap = [(b - t0, e - t0) for b, e in
              applies[bisect.bisect_left(applies, (t0,)):bisect.bisect_right(applies, (t1, 1e30))]]
        h, dl, rp = inside(hdr), inside(data), inside(replies)
        ak, ld = inside(acked), inside(landed)
        if not (h and dl and ap and rp and ld):
            continue
        rows.append({
            'first push at psd': min(h),
            'last push data landed': max(dl),
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
    print('%s: %d rounds (after the first fifth), medians, us from the push\'s hand-over'
          % (case, len(rows)))
    for k in rows[0]:
        v = statistics.median(r[k] for r in rows)
        print('  %-28s %9.1f' % (k, v) if k != 'apply jobs' else '  %-28s %9d' % (k, v))
    share = statistics.median(r['applies (summed)'] / r['round'] for r in rows)
    print('  %-28s %9.2f' % ('apply share of the round', share))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
