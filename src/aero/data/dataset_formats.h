// The on-disk dataset formats a directory can hold (`dataset.format`), one
// row each: how to tell that a directory holds it and how to open a split
// of it. A new format is a new row here and a reader beside the others.
#pragma once

#include "aero/data/dataset.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace slipstream::aero {

struct DatasetSource;

struct DatasetFormat {
  const char* name;  // its dataset.format value
  const char* what;  // for messages
  // Whether a directory whose manifest records no format holds this one
  // (dataset.format=auto tries the formats in order).
  std::function<bool(const DatasetSource&)> found_in;
  // The samples of `entries` (a split of the manifest at manifest_path).
  std::function<std::shared_ptr<Dataset>(
      const DatasetSource& source, const std::vector<std::string>& entries,
      const std::string& manifest_path, const std::string& split)>
      open;
};

const std::vector<DatasetFormat>& dataset_formats();
// dataset.format's choices: "auto", then every format's name.
std::vector<std::string> dataset_format_choices();
// The format named `name`; an error listing the choices otherwise.
const DatasetFormat& dataset_format(const std::string& name);

}  // namespace slipstream::aero
