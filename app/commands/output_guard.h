// Where a command may write. An output never lands on one of its inputs, in
// a training run's directory or in a dataset, and never replaces a file the
// command did not write itself: each check throws naming the output and
// what it would destroy, before any work.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace slipstream::app {

// `dir` takes a command's output files (infer --split --out DIR). Refused:
// a directory that is one of `inputs` (or a file input's directory), a training run
// (checkpoints/, resolved_config.yaml or a run lock), a dataset
// (manifest.json), and an existing `DIR/<own>` that `ours` does not
// recognise as this command's.
void check_output_directory(const std::string& dir, const std::vector<std::string>& inputs,
                            const std::string& own,
                            const std::function<bool(const std::string&)>& ours);

// `file` is one output (infer --in RUN --out X.vtu, export --out F). Refused:
// one of `inputs`, a file inside an input directory or in a training run's
// checkpoints/, and an
// existing file that `ours` does not recognise.
void check_output_file(const std::string& file, const std::vector<std::string>& inputs,
                       const std::function<bool(const std::string&)>& ours);

// Whether the file's first line is a JSON record with "phase": `phase`.
bool first_record_is(const std::string& path, const std::string& phase);

}  // namespace slipstream::app
