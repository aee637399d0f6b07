// Static storage that is constructed at load and never destroyed, for the module state's parts
// (binding/module_state.h): C++ static destructors run after the interpreter has finalised, when
// releasing a reference would touch freed memory.
#pragma once

namespace fastree {

template <typename T>
union NeverDestroyed {
    NeverDestroyed() : value() {}
    ~NeverDestroyed() {}
    T value;
};

}  // namespace fastree
