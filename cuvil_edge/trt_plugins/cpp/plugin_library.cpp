// Entry points TensorRT looks up when it loads this library as a plugin library
// (IPluginRegistry::loadLibrary, trtexec --dynamicPlugins, IBuilderConfig plugins to serialize):
// setLoggerFinder, and getCreators for IPluginV3 creators (TensorRT 10).
#include "normalize_plugin.h"

// The library builds with hidden visibility; these two are its exported interface.
#define CUVIL_EXPORT __attribute__((visibility("default")))

namespace {
nvinfer1::ILoggerFinder* gLoggerFinder = nullptr;
} // namespace

extern "C" {

/// Called by TensorRT with its logger finder before getCreators.
CUVIL_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder)
{
    gLoggerFinder = finder;
}

/// The IPluginV3 creators this library provides.
/// @param[out] nbCreators number of entries in the returned array.
CUVIL_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    static cuvil::NormalizeU8Creator normalizeCreator;
    static nvinfer1::IPluginCreatorInterface* const creators[] = {&normalizeCreator};
    nbCreators = static_cast<int32_t>(sizeof(creators) / sizeof(creators[0]));
    return creators;
}

} // extern "C"
