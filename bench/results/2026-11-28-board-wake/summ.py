import json,glob,statistics,collections
cells=collections.defaultdict(lambda: {"base":[], "cur":[], "mpi":[]})
for v in ["base2","cur2"]:
    for f in sorted(glob.glob(f"bench/results/2026-11-28-board-wake/runs/shm-{v}-*/compare.json")):
        for r in json.load(open(f))["rows"]:
            k=(r["collective"],r["ranks"],r.get("size") or r.get("bytes"))
            cells[k][v[:-1]].append(r["collectix_us"]); cells[k]["mpi"].append(r["mpi_us"])
print(f"shm: collectix µs, median of {len(next(iter(cells.values()))['base'])} alternating runs (min–max); Open MPI µs in the same runs")
print("| collective | W | size | before | after | after/before | Open MPI |")
print("|---|---|---|---|---|---|---|")
for k,c in sorted(cells.items(), key=lambda x:(x[0][1],x[0][0],str(x[0][2]))):
    o,n=c["base"],c["cur"]
    m=statistics.median(c["mpi"])
    print(f"| {k[0]} | {k[1]} | {k[2]} | {statistics.median(o):.2f} ({min(o):.2f}–{max(o):.2f}) | {statistics.median(n):.2f} ({min(n):.2f}–{max(n):.2f}) | {statistics.median(n)/statistics.median(o):.2f} | {m:.2f} |")
