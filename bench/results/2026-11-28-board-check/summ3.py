import json,glob,statistics,collections
for t in ["local","shm"]:
    cells=collections.defaultdict(lambda: {"old":[], "new":[], "mpi_old":[], "mpi_new":[]})
    for v in ["old","new"]:
        for f in sorted(glob.glob(f"bench/results/2026-11-28-board-check/runs/{t}-{v}-*/compare.json")):
            for r in json.load(open(f))["rows"]:
                k=(r["collective"],r["ranks"])
                cells[k][v].append(r["collectix_us"]); cells[k]["mpi_"+v].append(r["mpi_us"])
    print(f"\n{t}: collectix µs, median of {len(cells[k]['old'])} alternating runs (min–max); Open MPI µs in the same runs")
    print("| collective | W | before | after | after/before | Open MPI |")
    print("|---|---|---|---|---|---|")
    for k,c in sorted(cells.items(), key=lambda x:(x[0][1],x[0][0])):
        o,n=c["old"],c["new"]
        m=statistics.median(c["mpi_old"]+c["mpi_new"])
        print(f"| {k[0]} | {k[1]} | {statistics.median(o):.2f} ({min(o):.2f}–{max(o):.2f}) | {statistics.median(n):.2f} ({min(n):.2f}–{max(n):.2f}) | {statistics.median(n)/statistics.median(o):.2f} | {m:.2f} |")
