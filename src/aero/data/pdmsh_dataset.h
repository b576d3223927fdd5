// PhysicsNeMo-Curator's data, read in place: one `.pdmsh` DomainMesh per run
// (tensordict's memory-mapped tree, core/io/tensordict_memmap.h), found
// under the dataset's root by a glob pattern (the recipe's
// `run_*/domain_*.pdmsh`):
//   <run>/domain_i.pdmsh/_tensordict/interior/          a Mesh: points (N, 3)
//                         _tensordict/point_data/       UMeanTrim (N, 3), ...
//   <run>/domain_i.pdmsh/_tensordict/boundaries/<name>/ a Mesh: points (V, 3),
//                         cells (C, 3), _tensordict/cell_data/ pMeanTrim, ...
//   <run>/domain_i.pdmsh/_tensordict/global_data/       U_inf (3), rho_inf,
//                                                       p_inf, nu, L_ref
//   <run>/*_single_solid.stl.pmsh                       a triangle Mesh: the
//                                                       body, for the SDF
// A volume sample is the interior's points with its point fields renamed to
// the targets (the recipe's RenameMeshFields map) and the SDF and its normals
// to the body, computed for the requested points only. A surface sample is
// the boundary's cells: centroids, outward unit normals, areas and the
// renamed cell fields, the case's globals merged with the boundary's own.
// Nothing is copied or converted: a step reads only the rows it samples.
// A volume's body is built into its distance structure once and kept
// (PdmshOptions::body_cache_bytes): a step then costs O(k log T) for k
// points and T triangles, not O(T). The mean of a volume's points (for the
// center transform) is computed once per sample.
#pragma once

#include "aero/data/dataset.h"
#include "aero/geometry/triangle_mesh.h"

#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace slipstream::aero {

struct PdmshOptions {
  std::string kind = "volume";                       // volume | surface
  std::string pattern = "run_*/*.pdmsh";             // the samples, relative to the root
  std::string geometry = "*_single_solid.stl.pmsh";  // volume: the body, next to the sample
  std::string boundary = "vehicle";                  // surface: boundaries/<name>
  std::map<std::string, std::string> fields;         // name in the file -> target name
  // Volume: the bodies' distance structures (BVH) kept across steps, least
  // recently used dropped first beyond this many bytes.
  size_t body_cache_bytes = size_t{4} << 30;
};

// The files matching a glob pattern under `root` ('*', '?' and [...] within
// a path component), relative to it, sorted.
std::vector<std::string> glob_relative(const std::string& root, const std::string& pattern);

class PdmshDataset : public Dataset {
 public:
  // `samples`: paths relative to `root` (from glob_relative and a manifest).
  PdmshDataset(std::string root, std::vector<std::string> samples, PdmshOptions options);
  size_t size() const override { return samples_.size(); }
  Sample get(size_t index) const override;
  Sample get(size_t index, const PointRequest& request) const override;
  std::string describe() const override;
  SampleLayout layout() const override;
  void check_headers() const override;
  // How many bodies' distance structures were built (each once while it
  // stays in the cache).
  int64_t bodies_built() const;

 private:
  std::string path(size_t index) const { return root_ + "/" + samples_.at(index); }
  SampleLayout layout_of_file(size_t index) const;

  // Whether a surface sample's cells face inward, from its whole surface
  // (once per sample: a step then touches only the cells it samples).
  bool inward(size_t index, const at::Tensor& vertices, const at::Tensor& cells,
              const std::string& name) const;

  std::string root_;
  std::vector<std::string> samples_;
  PdmshOptions options_;
  mutable std::mutex mutex_;
  mutable std::map<size_t, bool> inward_;
  mutable std::map<size_t, at::Tensor> points_mean_;
  // Most recently used first: (key, structure, bytes).
  struct Body {
    std::string key;
    std::shared_ptr<const SignedDistance> distance;
    size_t bytes = 0;
  };
  std::shared_ptr<const SignedDistance> body(const std::string& key,
                                             const std::function<TriangleMesh()>& load) const;
  mutable std::list<Body> bodies_;
  mutable int64_t bodies_built_ = 0;
};

}  // namespace slipstream::aero
