# zeroplan_warnings(target): warnings on and fatal in the project's own code. Third-party headers
# (torch, boost) come in as SYSTEM include directories, so they do not trip -Werror.
function(zeroplan_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Werror -Wno-error=deprecated-declarations)
endfunction()
