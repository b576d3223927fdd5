#!/usr/bin/env bash
# Makes a dataset of Ahmed bodies with OpenFOAM (Debian 12's `openfoam`
# package, v1912): the kind of data in the shared Ahmed dataset, from
# nothing but this repository.
#
#   bash scripts/ahmed_dataset.sh OUT [--cases N] [--jobs J] [--seed S] [--mesh standard|coarse]
#                                     [--export DIR]
#
# Case i (0-based) is body i of a Latin hypercube of N bodies drawn with seed
# S (`slipstream ahmed-body`: slant 0-40 degrees, length, width and height
# x 0.9-1.1). Each case: blockMesh + snappyHexMesh around the body's STL,
# simpleFoam (steady RANS, k-omega SST with wall functions, U_inf 40 m/s,
# nu 1.5e-5, moving ground, slip top and sides, the full body: no symmetry
# plane), run until CD settles (at least MIN iterations and |CD - mean of the
# last 100| < 5e-4, at most MAX), then AVG more iterations averaging U, p,
# nut and wallShearStress (fieldAverage: UMean, pMean, nutMean,
# wallShearStressMean). What stays in OUT/run_<i+1>/ is an OpenFOAM case at
# its last time, with postProcessing/forceCoeffs and a metadata.json holding
# the references, the body's parameters and OpenFOAM's coefficients averaged
# over the same iterations as the fields (CD_cfd, CL_cfd, CS_cfd). Read it
# with
#   slipstream prepare --format openfoam --in OUT --out DIR --patch body \
#     --field velocity=UMean --field pressure=pMean --field nut=nutMean \
#     --field wss=wallShearStressMean dataset=ahmed_surface   (or ahmed_volume)
# --export DIR also writes each case as a run of DrivAerML's raw layout, the
# shared dataset's (`slipstream export-case`: DIR/run_<i+1>/boundary_<i+1>.vtp
# with pMeanTrim and wallShearStressMeanTrim, volume_<i+1>.vtu with 60,000
# fluid cells, drivaer_<i+1>.stl, force_mom_<i+1>.csv, metadata.json), which
# `slipstream prepare --in DIR` reads like the shared dataset.
#
# Resumable: a finished case (run_<i>/done) is skipped, an unfinished one is
# started again from nothing. J cases run at once, each on one core (several
# one-core cases beat MPI on cases this small). One line per case on stdout.
#
# --mesh standard: background cells of 0.16 m, the body at 1 cm, a wake box
#   at 2 cm and a near box at 4 cm, 2 prism layers (the shared dataset's
#   settings on the full body: ~160k cells, several minutes a case).
# --mesh coarse: background 0.32 m, the body at 2 cm, a wake box at 4 cm, no
#   layers, fewer iterations: under a minute or two a case, for tests.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
[ $# -ge 1 ] || usage 2
out=""; cases=30; jobs=$(nproc); seed=1; mesh=standard; one=""; export_dir=""
while [ $# -gt 0 ]; do
  case $1 in
    --cases) cases=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --mesh) mesh=$2; shift 2 ;;
    --export) export_dir=$2; shift 2 ;;
    --one) one=$2; shift 2 ;;  # internal: run case $2 alone
    -h|--help) usage ;;
    -*) echo "ahmed_dataset: unknown option $1" >&2; usage 2 ;;
    *) [ -z "$out" ] || { echo "ahmed_dataset: one OUT only ($out, $1)" >&2; exit 2; }; out=$1; shift ;;
  esac
done
[ -n "$out" ] || { echo "ahmed_dataset: OUT is missing" >&2; exit 2; }
case $mesh in standard|coarse) ;; *) echo "ahmed_dataset: --mesh is standard or coarse, not '$mesh'" >&2; exit 2 ;; esac
[[ $cases =~ ^[1-9][0-9]*$ && $jobs =~ ^[1-9][0-9]*$ && $seed =~ ^[0-9]+$ ]] ||
  { echo "ahmed_dataset: --cases and --jobs must be >= 1, --seed >= 0" >&2; exit 2; }
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${SLIPSTREAM_BIN:-$here/build/app/slipstream}
[ -x "$bin" ] || { echo "ahmed_dataset: no slipstream at $bin (build it, or set SLIPSTREAM_BIN)" >&2; exit 2; }
if [ -z "${WM_PROJECT_DIR:-}" ]; then  # OpenFOAM's environment (Debian's package keeps it here)
  [ -f /usr/share/openfoam/etc/bashrc ] || {
    echo "ahmed_dataset: OpenFOAM is not installed (apt-get install openfoam)" >&2; exit 2; }
  set +u; source /usr/share/openfoam/etc/bashrc 2>/dev/null || true; set -u
fi
command -v simpleFoam >/dev/null || { echo "ahmed_dataset: no simpleFoam on PATH" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
if [ -n "$export_dir" ]; then
  mkdir -p "$export_dir"
  export_dir=$(cd "$export_dir" && pwd)
  [ "$export_dir" != "$out" ] || { echo "ahmed_dataset: --export must not be OUT" >&2; exit 2; }
fi

if [ -z "$one" ]; then
  t0=$SECONDS
  echo "ahmed_dataset: $cases cases ($mesh mesh, seed $seed) into $out, $jobs at a time"
  rc=0
  seq 0 $((cases - 1)) | xargs -P "$jobs" -I{} bash "$0" "$out" --cases "$cases" --seed "$seed" \
    --mesh "$mesh" ${export_dir:+--export "$export_dir"} --one {} || rc=$?
  done_count=$(find "$out" -maxdepth 2 -name done | wc -l)
  echo "ahmed_dataset: $done_count of $cases cases done in $((SECONDS - t0)) s"
  [ "$rc" -eq 0 ] && [ "$done_count" -ge "$cases" ] || exit 1
  exit 0
fi

# ---- one case --------------------------------------------------------------
i=$one
run=$out/run_$((i + 1))
export_run() {  # the finished case in DrivAerML's layout, once
  [ -n "$export_dir" ] || return 0
  local to=$export_dir/run_$((i + 1))
  [ -f "$to/boundary_$((i + 1)).vtp" ] && return 0
  rm -rf "$to"
  "$bin" export-case --case "$run" --out "$to" --index $((i + 1)) --patch body --seed "$i" \
    --field velocity=UMean --field pressure=pMean --field nut=nutMean \
    --field wss=wallShearStressMean > "$run/logs/export-case.log" 2>&1 ||
    { echo "run_$((i + 1)): FAILED in export-case (see $run/logs/export-case.log)"; exit 1; }
}
if [ -f "$run/done" ]; then
  export_run
  echo "run_$((i + 1)): done earlier ($(cat "$run/done"))"
  exit 0
fi
work=$run.partial
rm -rf "$work"
mkdir -p "$work"/{0,constant/triSurface,system,logs}
cd "$work"
start=$SECONDS
fail() { echo "run_$((i + 1)): FAILED in $1 (see $work/logs/$1.log)"; exit 1; }

eval "$("$bin" ahmed-body --out constant/triSurface/body.stl --case "$i" --cases "$cases" \
  --seed "$seed")"
if [ "$mesh" = standard ]; then
  h0=0.16; level=4; wake=3; near=2; layers=true; min_it=500; max_it=3000; avg=300; chunk=100
else
  h0=0.32; level=4; wake=3; near=3; layers=false; min_it=150; max_it=600; avg=100; chunk=50
fi
# The domain, in whole background cells: x from 2.56 m ahead of the nose to
# 5.4 m behind the base, y +-1.28, z from the ground up to 1.44 (at least).
cells() { python3 -c "import math; print(max(1, math.ceil(round($1 / $h0, 6))))"; }
x0=-2.56; nx=$(cells "($length + 5.4 + 2.56)"); ny=$(cells 2.56); nz=$(cells 1.44)
x1=$(python3 -c "print($x0 + $nx * $h0)"); y1=$(python3 -c "print($ny * $h0 / 2)")
z1=$(python3 -c "print($nz * $h0)")
aref=$aRef
top=$(python3 -c "print($clearance + $height)")

header() {  # class object
  printf 'FoamFile\n{\n    version 2.0;\n    format ascii;\n    class %s;\n    object %s;\n}\n' "$1" "$2"
}
{ header dictionary blockMeshDict; cat <<D
convertToMeters 1;
vertices (($x0 -$y1 0) ($x1 -$y1 0) ($x1 $y1 0) ($x0 $y1 0)
          ($x0 -$y1 $z1) ($x1 -$y1 $z1) ($x1 $y1 $z1) ($x0 $y1 $z1));
blocks (hex (0 1 2 3 4 5 6 7) ($nx $ny $nz) simpleGrading (1 1 1));
boundary
(
    inlet { type patch; faces ((0 4 7 3)); }
    outlet { type patch; faces ((1 2 6 5)); }
    ground { type wall; faces ((0 3 2 1)); }
    top { type patch; faces ((4 5 6 7)); }
    sides { type patch; faces ((0 1 5 4) (3 7 6 2)); }
);
D
} > system/blockMeshDict
{ header dictionary snappyHexMeshDict; cat <<D
castellatedMesh true;
snap true;
addLayers $layers;
geometry
{
    body.stl { type triSurfaceMesh; name body; }
    wake { type searchableBox; min ($(python3 -c "print($length - 0.1)") -$(python3 -c "print($width / 2 + 0.1)") 0);
           max ($(python3 -c "print($length + 0.8)") $(python3 -c "print($width / 2 + 0.1)") $(python3 -c "print($top + 0.1)")); }
    near { type searchableBox; min (-0.3 -$(python3 -c "print($width / 2 + 0.3)") 0);
           max ($(python3 -c "print($length + 2.0)") $(python3 -c "print($width / 2 + 0.3)") $(python3 -c "print($top + 0.4)")); }
}
castellatedMeshControls
{
    maxLocalCells 2000000; maxGlobalCells 4000000; minRefinementCells 0;
    nCellsBetweenLevels 3; maxLoadUnbalance 0.1;
    features ();
    refinementSurfaces { body { level ($level $level); patchInfo { type wall; } } }
    resolveFeatureAngle 30;
    refinementRegions
    {
        wake { mode inside; levels ((1e15 $wake)); }
        near { mode inside; levels ((1e15 $near)); }
    }
    locationInMesh (-2.0123 0.0123 1.0123);
    allowFreeStandingZoneFaces true;
}
snapControls { nSmoothPatch 3; tolerance 2.0; nSolveIter 50; nRelaxIter 5;
    nFeatureSnapIter 10; implicitFeatureSnap true; explicitFeatureSnap false;
    multiRegionFeatureSnap false; }
addLayersControls { relativeSizes true; layers { body { nSurfaceLayers 2; } }
    expansionRatio 1.2; finalLayerThickness 0.4; minThickness 0.1; nGrow 0;
    featureAngle 60; slipFeatureAngle 30; nRelaxIter 3; nSmoothSurfaceNormals 1;
    nSmoothNormals 3; nSmoothThickness 10; maxFaceThicknessRatio 0.5;
    maxThicknessToMedialRatio 0.3; minMedialAxisAngle 90; nBufferCellsNoExtrude 0;
    nLayerIter 50; }
meshQualityControls { maxNonOrtho 65; maxBoundarySkewness 20; maxInternalSkewness 4;
    maxConcave 80; minVol 1e-13; minTetQuality 1e-15; minArea -1; minTwist 0.02;
    minDeterminant 0.001; minFaceWeight 0.05; minVolRatio 0.01; minTriangleTwist -1;
    nSmoothScale 4; errorReduction 0.75; relaxed { maxNonOrtho 75; } }
mergeTolerance 1e-6;
D
} > system/snappyHexMeshDict
# controlDict: END the last iteration, AVG_START where fieldAverage starts
# (beyond END: none yet).
control() {
  { header dictionary controlDict; cat <<D
application simpleFoam;
startFrom latestTime; startTime 0; stopAt endTime; endTime $1; deltaT 1;
writeControl timeStep; writeInterval $chunk; purgeWrite 1;
writeFormat binary; writePrecision 8; writeCompression off;
timeFormat general; timePrecision 8; runTimeModifiable false;
functions
{
    wallShearStress { type wallShearStress; libs ("libfieldFunctionObjects.so");
        patches (body); writeControl writeTime; log false; }
    forceCoeffs { type forceCoeffs; libs ("libforces.so"); writeControl timeStep;
        writeInterval 1; patches (body); rho rhoInf; rhoInf 1; liftDir (0 0 1);
        dragDir (1 0 0); CofR (0 0 0); pitchAxis (0 1 0); magUInf 40; lRef $length;
        Aref $aref; log false; }
    fieldAverage { type fieldAverage; libs ("libfieldFunctionObjects.so");
        timeStart $2; writeControl writeTime; restartOnRestart false;
        fields ( U { mean on; prime2Mean off; base iteration; }
                 p { mean on; prime2Mean off; base iteration; }
                 nut { mean on; prime2Mean off; base iteration; }
                 wallShearStress { mean on; prime2Mean off; base iteration; } ); }
}
D
  } > system/controlDict
}
control "$min_it" 1e9
{ header dictionary fvSchemes; cat <<'D'
ddtSchemes { default steadyState; }
gradSchemes { default Gauss linear; grad(U) cellLimited Gauss linear 1; }
divSchemes { default none; div(phi,U) bounded Gauss linearUpwind grad(U);
    div(phi,k) bounded Gauss upwind; div(phi,omega) bounded Gauss upwind;
    div((nuEff*dev2(T(grad(U))))) Gauss linear; }
laplacianSchemes { default Gauss linear limited corrected 0.33; }
interpolationSchemes { default linear; }
snGradSchemes { default limited corrected 0.33; }
wallDist { method meshWave; }
D
} > system/fvSchemes
{ header dictionary fvSolution; cat <<'D'
solvers { p { solver GAMG; smoother GaussSeidel; tolerance 1e-7; relTol 0.1; }
    "(U|k|omega)" { solver smoothSolver; smoother symGaussSeidel; tolerance 1e-8; relTol 0.1; } }
SIMPLE { nNonOrthogonalCorrectors 0; consistent yes; }
relaxationFactors { equations { U 0.7; k 0.5; omega 0.5; } fields { p 1; } }
D
} > system/fvSolution
{ header dictionary transportProperties; echo "transportModel Newtonian; nu 1.5e-05;"; } \
  > constant/transportProperties
{ header dictionary turbulenceProperties
  echo "simulationType RAS; RAS { RASModel kOmegaSST; turbulence on; printCoeffs off; }"; } \
  > constant/turbulenceProperties
# Inlet turbulence: intensity 0.5 % (k = 1.5 (0.005 x 40)^2 = 0.06) and
# nu_t / nu = 10 (omega = k / (10 nu) = 400).
field() {  # name class dimensions internal inlet outlet ground body
  { header "$2" "$1"; cat <<D
dimensions $3;
internalField uniform $4;
boundaryField
{
    inlet { $5 }
    outlet { $6 }
    ground { $7 }
    top { type slip; }
    sides { type slip; }
    body { $8 }
}
D
  } > "0/$1"
}
field U volVectorField "[0 1 -1 0 0 0 0]" "(40 0 0)" "type fixedValue; value uniform (40 0 0);" \
  "type inletOutlet; inletValue uniform (0 0 0); value uniform (40 0 0);" \
  "type fixedValue; value uniform (40 0 0);" "type noSlip;"
field p volScalarField "[0 2 -2 0 0 0 0]" 0 "type zeroGradient;" \
  "type fixedValue; value uniform 0;" "type zeroGradient;" "type zeroGradient;"
field k volScalarField "[0 2 -2 0 0 0 0]" 0.06 "type fixedValue; value uniform 0.06;" \
  "type inletOutlet; inletValue uniform 0.06; value uniform 0.06;" \
  "type kqRWallFunction; value uniform 0.06;" "type kqRWallFunction; value uniform 0.06;"
field omega volScalarField "[0 0 -1 0 0 0 0]" 400 "type fixedValue; value uniform 400;" \
  "type inletOutlet; inletValue uniform 400; value uniform 400;" \
  "type omegaWallFunction; value uniform 400;" "type omegaWallFunction; value uniform 400;"
field nut volScalarField "[0 2 -1 0 0 0 0]" 0 "type calculated; value uniform 0;" \
  "type calculated; value uniform 0;" "type nutkWallFunction; value uniform 0;" \
  "type nutkWallFunction; value uniform 0;"

blockMesh > logs/blockMesh.log 2>&1 || fail blockMesh
snappyHexMesh -overwrite > logs/snappyHexMesh.log 2>&1 || fail snappyHexMesh
checkMesh > logs/checkMesh.log 2>&1 || true
ncells=$(grep -m1 -E "^ +cells:" logs/checkMesh.log | awk '{print $2}')

# CD of every iteration so far (the forceCoeffs rows, restarts in order).
cd_rows() {
  find postProcessing/forceCoeffs -name coefficient.dat | sort -t/ -k3 -g | xargs cat |
    awk '/^# Time/ { for (c = 1; c <= NF; ++c) if ($c == "Cd") col = c - 1; next }
         /^#/ { next } { print $1, $col }'
}
converged() {  # at least min_it iterations and |CD - mean of the last 100| < 5e-4
  cd_rows | awk -v min="$min_it" '{ t[NR] = $1; d[NR] = $2 }
    END { if (NR < 100 || t[NR] < min) exit 1; s = 0; for (k = NR - 99; k <= NR; ++k) s += d[k];
          m = s / 100; e = d[NR] - m; if (e < 0) e = -e; exit !(e < 5e-4) }'
}
iterations=$min_it
simpleFoam > logs/simpleFoam.log 2>&1 || fail simpleFoam
state=converged
until converged; do
  if [ "$iterations" -ge "$max_it" ]; then state="not converged by $max_it"; break; fi
  iterations=$((iterations + chunk))
  control "$iterations" 1e9
  simpleFoam >> logs/simpleFoam.log 2>&1 || fail simpleFoam
done
# The average: AVG more iterations, the fields and the coefficients alike.
control $((iterations + avg)) "$iterations"
simpleFoam >> logs/simpleFoam.log 2>&1 || fail simpleFoam
last=$((iterations + avg))
means=$(find postProcessing/forceCoeffs -name coefficient.dat | sort -t/ -k3 -g | xargs cat |
  awk -v from="$iterations" '/^# Time/ { for (c = 1; c <= NF; ++c) { if ($c == "Cd") d = c - 1;
    if ($c == "Cl") l = c - 1; if ($c == "Cs") s = c - 1 } next } /^#/ { next }
    $1 > from { n++; cd += $d; cl += $l; if (s) cs += $s }
    END { if (!n) exit 1; printf "%.8f %.8f %.8f %d", cd / n, cl / n, cs / n, n }') ||
  fail average
read -r cd cl cs navg <<<"$means"
cat > metadata.json <<D
{
  "U_inf": [40.0, 0.0, 0.0], "rho_inf": 1.0, "p_inf": 0.0, "nu": 1.5e-05,
  "L_ref": $length, "A_ref": $aref,
  "CD_cfd": $cd, "CL_cfd": $cl, "CS_cfd": $cs,
  "phi": $phi, "length": $length, "width": $width, "height": $height,
  "front_radius": $front_radius, "slant_length": $slant_length, "clearance": $clearance,
  "note": "OpenFOAM v1912 simpleFoam, k-omega SST; kinematic p/rho and wallShearStress (the wall's stress on the fluid); UMean, pMean, nutMean, wallShearStressMean and CD_cfd/CL_cfd/CS_cfd averaged over iterations $((iterations + 1))-$last ($mesh mesh, case $i of $cases, seed $seed)"
}
D
printf 'lRef,aRef,aRefRef,phi,length,width,height,front_radius,slant_length,clearance\n%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n' \
  "$length" "$aref" "$aRefRef" "$phi" "$length" "$width" "$height" "$front_radius" \
  "$slant_length" "$clearance" > "geo_ref_$((i + 1)).csv"
# Keep the last time alone (and no solver restart files).
for t in [0-9]*; do [ "$t" = "$last" ] || rm -rf "$t"; done
rm -rf "$last/uniform" constant/extendedFeatureEdgeMesh
cd "$out"
rm -rf "$run"
mv "$work" "$run"
summary="phi $phi, L $length W $width H $height: $ncells cells, $iterations iterations ($state), CD $cd CL $cl averaged over $navg, $((SECONDS - start)) s"
echo "$summary" > "$run/done"
export_run
echo "run_$((i + 1)): $summary"
