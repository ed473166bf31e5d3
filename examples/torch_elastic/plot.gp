# SPDX-License-Identifier: Apache-2.0
# The demo's picture (scripts/demo.sh): throughput and world size over time
# with join / leave / failure events marked, and test accuracy over steps
# against the single-process run of the same model.
# Usage: gnuplot -e "dir='report'; t0=<unix time of the start>" plot.gp
if (!exists("dir")) dir = "report"
if (!exists("t0")) t0 = 0
if (!exists("out")) out = dir."/demo.png"

set terminal pngcairo size 1000,760 font "sans,10"
set output out
set datafile separator ","
set key top left opaque box
set grid
set multiplot layout 2,1

metrics = dir."/metrics.csv"
events = dir."/events.csv"
ref = dir."/reference.csv"

# Event colours: join green, leave blue, failure red; the initial formation is not drawn.
colour(e) = e eq "join" ? 0x1a9850 : e eq "leave" ? 0x4575b4 : 0xd73027
shown(e) = e eq "initial" ? NaN : 1

stats metrics using 9 nooutput
ymax1 = STATS_max * 1.25
stats metrics using 6 nooutput
wmax = STATS_max + 1

set title "Throughput and world size (4 workers of different speeds; one joins, one is killed)"
set xlabel "time since start (s)"
set ylabel "samples/s (last 10 steps)"
set y2label "workers"
set yrange [0:ymax1]
set y2range [0:wmax]
set y2tics 1
set ytics nomirror
plot metrics using ($2 - t0):9 with lines lw 2 lc rgb "#3060a0" title "samples/s", \
     metrics using ($2 - t0):6 axes x1y2 with steps lw 2 lc rgb "#808080" title "world size", \
     events using ($1 - t0):(0):(0):(ymax1 * shown(strcol(3))):(colour(strcol(3))) \
       with vectors nohead dt 2 lw 2 lc rgb variable notitle, \
     events using ($1 - t0):(ymax1 * 0.95 * shown(strcol(3))):(sprintf("%s (%d→%d)", strcol(3), $4, $5)) \
       with labels left offset 0.5,0 notitle

unset y2label
unset y2tics
set ytics mirror
set title "Test accuracy: elastic heterogeneous run vs single process (same global batches)"
set xlabel "step"
set ylabel "test accuracy (%)"
set yrange [50:100]
set key bottom right
if (!exists("target")) target = 0.95
plot ref using 1:(100 * $3) with lines lw 7 lc rgb "#b0b0b0" title "single process", \
     metrics using 1:(100 * $8) with linespoints pt 7 ps 0.5 lw 2 lc rgb "#d95f02" title "elastic (ebbflow)", \
     100 * target with lines dt 3 lw 1 lc rgb "#000000" title sprintf("target %.0f %%", 100 * target), \
     events using 2:(50):(0):(50 * shown(strcol(3))):(colour(strcol(3))) \
       with vectors nohead dt 2 lw 2 lc rgb variable notitle
unset multiplot
